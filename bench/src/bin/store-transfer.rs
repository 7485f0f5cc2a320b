//! The storage benchmark's drivetrain side: publish the files of DIR as an artifact to
//! the store at URL (configured from the environment, as the engine is) and materialize
//! it again, the way a stage's output and the next stage's input go; prints the two
//! wall times in seconds as JSON.
//!
//! usage: store-transfer URL DIR SCRATCH [--upload-only]

use std::process::ExitCode;
use std::time::Instant;

use drivetrain_engine::artifacts::{ArtifactStore, AttemptKey};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (url, dir, scratch, download) = match args.as_slice() {
        [_, url, dir, scratch] => (url, dir, scratch, true),
        [_, url, dir, scratch, flag] if flag == "--upload-only" => (url, dir, scratch, false),
        _ => {
            eprintln!("usage: store-transfer URL DIR SCRATCH [--upload-only]");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let result = rt.block_on(async {
        let store = ArtifactStore::open(url)?;
        let key = AttemptKey::of_stage(format!("bench-{}", std::process::id()), "transfer", 1);
        let t = Instant::now();
        let art = store
            .publish_dir(&key, "data", std::path::Path::new(dir))
            .await?;
        let upload = t.elapsed().as_secs_f64();
        let t = Instant::now();
        if download {
            store
                .materialize(&art, std::path::Path::new(scratch))
                .await?;
        }
        let download = t.elapsed().as_secs_f64();
        Ok::<_, drivetrain_engine::artifacts::ArtifactError>((upload, download))
    });
    match result {
        Ok((upload, download)) => {
            println!(
                "{}",
                serde_json::json!({"upload_s": upload, "download_s": download})
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

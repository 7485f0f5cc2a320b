//! The cost of the sha256 every published file gets (issue 26): an output of N MiB is
//! published to a `file://` store (a hard link, then the hash) and materialized as an
//! input (the hash, then a hard link), against the floor of reading the same bytes once
//! from the page cache, in the same run. Prints seconds per GiB of each as JSON.
//!
//! usage: publish-hash DIR MIB

use std::io::Read;
use std::time::Instant;

use drivetrain_engine::artifacts::{ArtifactStore, AttemptKey};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, mib] = args.as_slice() else {
        eprintln!("usage: publish-hash DIR MIB");
        std::process::exit(2);
    };
    let mib: usize = mib.parse().expect("MIB is a number");
    let root = std::path::PathBuf::from(dir);
    let _ = std::fs::remove_dir_all(&root);
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // Bytes that do not compress or repeat: a xorshift stream.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let block: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(out.join("data.bin")).unwrap();
        for i in 0..mib {
            let mut b = block.clone();
            b[0] = i as u8;
            f.write_all(&b).unwrap();
        }
    }
    let gib = mib as f64 / 1024.0;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = ArtifactStore::open(&format!("file://{}/store", root.display())).unwrap();
    // The floor: one read of the bytes (warm: the file was just written).
    let t = Instant::now();
    let mut f = std::fs::File::open(out.join("data.bin")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0usize;
    while let Ok(k) = f.read(&mut buf) {
        if k == 0 {
            break;
        }
        n += k;
    }
    let read = t.elapsed().as_secs_f64();
    assert_eq!(n, mib << 20);
    let key = AttemptKey::of_stage("bench", "s", 1);
    let t = Instant::now();
    let art = rt.block_on(store.publish_dir(&key, "data", &out)).unwrap();
    let publish = t.elapsed().as_secs_f64();
    let t = Instant::now();
    rt.block_on(store.materialize(&art, &root.join("in")))
        .unwrap();
    let materialize = t.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "mib": mib,
            "read_s_per_gib": read / gib,
            "publish_s_per_gib": publish / gib,
            "materialize_s_per_gib": materialize / gib,
            "publish_over_read": publish / read,
            "materialize_over_read": materialize / read,
        })
    );
    let _ = std::fs::remove_dir_all(&root);
}

//! `drivetrain doctor`: what this machine offers local runs — cores, GPUs (and how they
//! were found), and each layer of a local stage's containment: active here or not.

use crate::output::Format;
use std::path::Path;
use std::process::ExitCode;

use serde_json::json;

/// Prints the machine's report, as text or JSON; with `slurm` (the home), the Slurm
/// cluster's too: exit 1 when it cannot run this home's stages.
pub fn doctor(
    gpus: Option<usize>,
    home: &Path,
    slurm: bool,
    out: Format,
) -> anyhow::Result<ExitCode> {
    let slurm = slurm.then(|| slurm_report(home));
    let private = private_home(home);
    let failed = slurm
        .as_ref()
        .is_some_and(|r| r.get("ok") == Some(&json!(false)));
    let code = if failed {
        crate::exit::failed()
    } else {
        ExitCode::SUCCESS
    };
    let cores = crate::runs::default_parallelism();
    let found = drivetrain_executors::gpus::detect(gpus);
    let isolation = drivetrain_executors::local::namespaces_work();
    let layers = drivetrain_executors::local::layers();
    let claims = gpu_claims(home);
    if out.json() {
        let list: Vec<_> = found
            .gpus
            .iter()
            .map(|g| json!({"id": g.id, "name": g.name}))
            .collect();
        crate::output::print_json(&json!({
            "cores": cores,
            "gpus": list,
            "gpus_from": found.source,
            "isolation": isolation,
            "home": private,
            "layers": layers
                .iter()
                .map(|(name, active, what)| json!({"layer": name, "active": active, "what": what}))
                .collect::<Vec<_>>(),
            "slurm": slurm,
            "gpu_claims": claims,
        }))?;
        return Ok(code);
    }
    println!("cores: {cores} (the default --parallelism)");
    match found.gpus.len() {
        0 => println!(
            "gpus: none (no NVML, no nvidia-smi, or CUDA_VISIBLE_DEVICES hides them); \
             stages asking for one cannot run here"
        ),
        n => {
            println!("gpus: {n} from {}", found.source);
            for g in &found.gpus {
                println!("  {} {}", g.id, g.name.as_deref().unwrap_or(""));
            }
        }
    }
    match claims.as_array().map(Vec::as_slice) {
        None => println!(
            "gpu ledger: not read: {}",
            claims["error"].as_str().unwrap_or_default()
        ),
        Some([]) => println!("gpu ledger: no device claimed in this home"),
        Some(held) => {
            println!("gpu ledger: {} device(s) claimed in this home", held.len());
            for c in held {
                let f = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                let stale = match c["stale"] == true {
                    true => " — stale: its run ended, the next claim frees it",
                    false => "",
                };
                println!(
                    "  {}:{} run {} ({}) since {}{stale}",
                    f("host"),
                    f("device"),
                    f("run"),
                    f("holder"),
                    f("claimed_at")
                );
            }
        }
    }
    println!(
        "isolation: {}",
        match isolation {
            true => "each attempt gets a private mount namespace (store and inputs read-only)",
            false => "no mount namespaces here: inputs are checked after each attempt instead",
        }
    );
    for (name, active, what) in &layers {
        println!(
            "  {:<18} {:<3} {what}",
            name,
            if *active { "yes" } else { "no" }
        );
    }
    println!("home: {}", private["says"].as_str().unwrap_or_default());
    if let Some(r) = &slurm {
        let field = |k: &str| r.get(k).and_then(|v| v.as_str()).unwrap_or("").to_owned();
        println!("slurm: {}", field("cluster"));
        println!("  shared file system: {}", field("shared"));
    }
    Ok(code)
}

/// The home's GPU ledger: which attempt of which run holds each device, and whether the
/// claim is stale (its run ended: the next claim frees it); none when the home has no
/// state yet.
fn gpu_claims(home: &Path) -> serde_json::Value {
    if !home.join("state.db").exists() && std::env::var_os("DRIVETRAIN_STATE").is_none() {
        return json!([]);
    }
    let read = crate::runs::open_state(home).and_then(|s| {
        let claims = s.gpu_claims()?;
        Ok(claims
            .into_iter()
            .map(|c| {
                let ended = s.run(&c.run).map_or(true, |r| r.phase.is_terminal());
                let mut v = json!(c);
                v["stale"] = json!(ended);
                v
            })
            .collect::<Vec<_>>())
    });
    match read {
        Ok(claims) => json!(claims),
        Err(e) => json!({"error": format!("{e:#}")}),
    }
}

/// Whether the home is closed to other users (a stage of another home among them).
fn private_home(home: &Path) -> serde_json::Value {
    let dir = home.display();
    if !home.is_dir() {
        return json!({"path": home, "private": true, "says": format!("{dir} is not made yet: drivetrain makes it closed to others (0700, its state 0600)")});
    }
    match drivetrain_engine::engine::home::open_to_others(home) {
        None => {
            json!({"path": home, "private": true, "says": format!("{dir} is closed to others (no one else lists it; its state is 0600): no stage of another home finds its runs")})
        }
        Some(mode) => {
            json!({"path": home, "private": false, "mode": format!("{mode:o}"), "says": format!("{dir} is open to other users (mode {mode:o}): a stage of another home can enter it and read its runs, artifacts and logs; `chmod 700 {dir}` closes it")})
        }
    }
}

/// The slurm executor's view from here: `sinfo`, and a probe job that must write into the
/// home's work directory, as every stage's job does.
fn slurm_report(home: &Path) -> serde_json::Value {
    let settings = match drivetrain_executors::slurm::Settings::from_env() {
        Ok(s) => s,
        Err(e) => return json!({"ok": false, "cluster": e, "shared": "not checked"}),
    };
    let executor = drivetrain_executors::slurm::SlurmExecutor::new(settings);
    let Ok(rt) = crate::runtime() else {
        return json!({"ok": false, "cluster": "no runtime", "shared": "not checked"});
    };
    let work = home.join("work");
    let _ = std::fs::create_dir_all(&work);
    rt.block_on(async {
        let cluster = executor.check().await;
        let shared = match &cluster {
            Ok(_) => executor.probe(&work).await,
            Err(_) => Err("not checked".to_owned()),
        };
        json!({
            "ok": cluster.is_ok() && shared.is_ok(),
            "cluster": match &cluster { Ok(s) => format!("answers: {s}"), Err(e) => format!("unreachable: {e}") },
            "shared": match &shared { Ok(s) => s.clone(), Err(e) => format!("NO: {e}") },
        })
    })
}

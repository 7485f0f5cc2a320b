//! `train`: the reference trainer, data-parallel over the ranks the executor starts.
//!
//! Every rank reads the training split, takes every `WORLD_SIZE`-th row from its `RANK`,
//! and computes the gradient of the logistic loss on its share of each global batch;
//! rank 0 (listening on `MASTER_ADDR:MASTER_PORT`) sums the gradients of all ranks,
//! weighted by their rows, and sends the average back: a ring-less all-reduce over TCP.
//! Every rank applies the same update, so the weights stay identical. Rank 0 writes a
//! checkpoint after each epoch to `DRIVETRAIN_CHECKPOINTS` (kept across the attempts of
//! a stage), and a restarted attempt resumes from the last one. Rank 0 writes
//! `model/model.json` and `metrics/metrics.json`; in a search's trial it also pushes each
//! epoch's `loss` and `accuracy` to `$DRIVETRAIN_METRICS`. `TRAIN_FAIL_AFTER_EPOCH=N` in the
//! stage's `env` makes every rank fail after epoch N (to see a retry resume).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::model::{normalization, raw_features, sigmoid, standardize, Model, FEATURES};

/// How ranks exchange gradients.
enum Reduce {
    Alone,
    Leader(Vec<TcpStream>),
    Follower(TcpStream),
}

fn write_vec(s: &mut TcpStream, v: &[f64]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(v.len() * 8);
    for x in v {
        buf.extend_from_slice(&x.to_le_bytes());
    }
    s.write_all(&buf)
}

fn read_vec(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<f64>> {
    let mut buf = vec![0u8; n * 8];
    s.read_exact(&mut buf)?;
    Ok(buf
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

impl Reduce {
    fn connect(rank: u32, world: u32, master: Option<&str>) -> anyhow::Result<Reduce> {
        if world <= 1 {
            return Ok(Reduce::Alone);
        }
        let addr = master.ok_or_else(|| {
            anyhow::anyhow!("WORLD_SIZE is {world} but MASTER_ADDR/MASTER_PORT are not set")
        })?;
        if rank == 0 {
            let listener = TcpListener::bind(addr)
                .map_err(|e| anyhow::anyhow!("rank 0 cannot listen on {addr}: {e}"))?;
            let mut peers: Vec<(u32, TcpStream)> = Vec::new();
            while peers.len() < (world - 1) as usize {
                let (mut s, _) = listener.accept()?;
                let r = read_vec(&mut s, 1)?[0] as u32;
                peers.push((r, s));
            }
            peers.sort_by_key(|(r, _)| *r);
            Ok(Reduce::Leader(peers.into_iter().map(|(_, s)| s).collect()))
        } else {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                match TcpStream::connect(addr) {
                    Ok(mut s) => {
                        write_vec(&mut s, &[f64::from(rank)])?;
                        return Ok(Reduce::Follower(s));
                    }
                    Err(e) if Instant::now() > deadline => {
                        anyhow::bail!("rank {rank} cannot reach rank 0 at {addr}: {e}")
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        }
    }

    /// Sums `v` over all ranks; every rank gets the sum.
    fn all_sum(&mut self, v: &mut Vec<f64>) -> anyhow::Result<()> {
        match self {
            Reduce::Alone => {}
            Reduce::Leader(peers) => {
                for p in peers.iter_mut() {
                    let other = read_vec(p, v.len())?;
                    for (a, b) in v.iter_mut().zip(other) {
                        *a += b;
                    }
                }
                for p in peers.iter_mut() {
                    write_vec(p, v)?;
                }
            }
            Reduce::Follower(s) => {
                write_vec(s, v)?;
                *v = read_vec(s, v.len())?;
            }
        }
        Ok(())
    }
}

fn latest_checkpoint(dir: &Path) -> Option<(u32, Model)> {
    let mut best: Option<(u32, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(n) = name
            .strip_prefix("epoch-")
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if best.as_ref().is_none_or(|(b, _)| n > *b) {
            best = Some((n, e.path()));
        }
    }
    let (n, path) = best?;
    let model = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    Some((n, model))
}

/// Trains on `rows` (the training split) as rank `rank` of `world`.
pub fn train(
    cfg: &TrainConfig,
    rows: &[Map<String, Value>],
    rank: u32,
    world: u32,
    master: Option<&str>,
    checkpoints: Option<&Path>,
) -> anyhow::Result<(Model, Value)> {
    if rows.is_empty() {
        anyhow::bail!("the training split is empty: label more frames or change the split");
    }
    let epochs = cfg.epochs.unwrap_or(5);
    let batch = cfg.batch_size.unwrap_or(32).max(world) as usize;
    let lr = cfg.learning_rate.unwrap_or(0.1);
    let raw: Vec<Vec<Option<f64>>> = rows.iter().map(raw_features).collect();
    // Every rank computes the same normalization from the whole split.
    let (mean, std) = normalization(&raw);
    let x: Vec<Vec<f64>> = raw.iter().map(|r| standardize(r, &mean, &std)).collect();
    let y: Vec<f64> = rows
        .iter()
        .map(|r| {
            f64::from(u8::from(
                r.get("label").and_then(Value::as_bool).unwrap_or(false),
            ))
        })
        .collect();
    let d = FEATURES.len();
    let mut model = Model {
        features: FEATURES.iter().map(|s| (*s).to_owned()).collect(),
        mean,
        std,
        weights: vec![0.0; d],
        bias: 0.0,
        epochs: 0,
    };
    let mut start = 0;
    if let Some((n, saved)) = checkpoints.and_then(latest_checkpoint) {
        if saved.features == model.features {
            if rank == 0 {
                println!("resuming from the checkpoint of epoch {n}");
            }
            model = saved;
            start = n;
        }
    }
    let mut reduce = Reduce::connect(rank, world, master)?;
    let n = x.len();
    let steps = n.div_ceil(batch);
    let mut history = Vec::new();
    for epoch in start..epochs {
        let mut epoch_loss = 0.0;
        for step in 0..steps {
            // Rows of this global batch that belong to this rank.
            let lo = step * batch;
            let hi = (lo + batch).min(n);
            let mut g = vec![0.0; d + 3]; // weights, bias, loss, rows
            for i in (lo..hi).filter(|i| i % world as usize == rank as usize) {
                let p = sigmoid(score(&model, &x[i]));
                let err = p - y[i];
                for j in 0..d {
                    g[j] += err * x[i][j];
                }
                g[d] += err;
                let pc = p.clamp(1e-9, 1.0 - 1e-9);
                g[d + 1] -= if y[i] > 0.5 { pc.ln() } else { (1.0 - pc).ln() };
                g[d + 2] += 1.0;
            }
            reduce.all_sum(&mut g)?;
            let count = g[d + 2].max(1.0);
            for (w, gj) in model.weights.iter_mut().zip(&g) {
                *w -= lr * (gj / count + 1e-4 * *w);
            }
            model.bias -= lr * g[d] / count;
            epoch_loss += g[d + 1];
        }
        model.epochs = epoch + 1;
        let loss = epoch_loss / n as f64;
        // Of every training row (each rank holds them all and the same weights).
        let accuracy = accuracy(&model, &x, &y);
        if rank == 0 {
            println!("epoch {} loss {loss:.4} accuracy {accuracy:.4}", epoch + 1);
        }
        history.push(json!({"epoch": epoch + 1, "loss": loss, "accuracy": accuracy}));
        if rank == 0 {
            push_metrics(epoch + 1, loss, accuracy)?;
        }
        if let (0, Some(dir)) = (rank, checkpoints) {
            save_checkpoint(dir, epoch + 1, &model)?;
        }
        if checkpoints.is_some() {
            // No rank goes on (or fails, and has its peers killed) before rank 0 has
            // saved this epoch: a retry then resumes from it, never from the one before.
            reduce.all_sum(&mut vec![0.0])?;
        }
        if std::env::var("TRAIN_FAIL_AFTER_EPOCH")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            == Some(epoch + 1)
        {
            anyhow::bail!(
                "failing after epoch {} as TRAIN_FAIL_AFTER_EPOCH asks",
                epoch + 1
            );
        }
    }
    Ok((
        model,
        json!({
            "epochs": history,
            "resumed_from_epoch": start,
            "world_size": world,
            "rows": n,
            "series": series(&history),
        }),
    ))
}

/// The model's score (before the sigmoid) of one standardized row.
fn score(model: &Model, row: &[f64]) -> f64 {
    model.bias
        + row
            .iter()
            .zip(&model.weights)
            .map(|(a, b)| a * b)
            .sum::<f64>()
}

/// The share of rows `x` the model labels as `y` does.
fn accuracy(model: &Model, x: &[Vec<f64>], y: &[f64]) -> f64 {
    let right = x
        .iter()
        .zip(y)
        .filter(|(row, label)| (sigmoid(score(model, row)) >= 0.5) == (**label > 0.5))
        .count();
    right as f64 / x.len().max(1) as f64
}

/// In a search's trial (`DRIVETRAIN_METRICS` set): the epoch's loss and accuracy, one
/// JSON line appended, for the search to decide on.
fn push_metrics(epoch: u32, loss: f64, accuracy: f64) -> anyhow::Result<()> {
    let Some(path) = std::env::var_os("DRIVETRAIN_METRICS") else {
        return Ok(());
    };
    let line = drivetrain_engine::search::lines::line(
        Some(i64::from(epoch)),
        &[("loss".into(), loss), ("accuracy".into(), accuracy)],
    );
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    f.write_all(format!("{line}\n").as_bytes())?;
    Ok(())
}

/// Writes the model after `epoch` into `dir` (atomically: a temporary file renamed).
fn save_checkpoint(dir: &Path, epoch: u32, model: &Model) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".epoch-{epoch}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(model)?)?;
    std::fs::rename(&tmp, dir.join(format!("epoch-{epoch}.json")))?;
    Ok(())
}

/// The epochs' loss and accuracy as `values.json`'s `series` (docs/spec.md: one named
/// series of `[x, y]` points each, drawn by the web view).
fn series(history: &[serde_json::Value]) -> serde_json::Value {
    let of = |key: &str| {
        let points: Vec<serde_json::Value> = history
            .iter()
            .map(|e| json!([e["epoch"], e[key]]))
            .collect();
        json!({"x": "epoch", "points": points})
    };
    json!({"loss": of("loss"), "accuracy": of("accuracy")})
}

// The `train` step: its `with:` block, registration and what it does with its context.

/// `train`: the reference trainer.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default)]
    pub epochs: Option<u32>,
    /// Global batch size, split across ranks.
    #[serde(default)]
    pub batch_size: Option<u32>,
    #[serde(default)]
    pub learning_rate: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<TrainConfig>(
        "train",
        "the reference risk model, trained data-parallel across ranks",
        &[("dataset", true)],
        &["model", "metrics"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .reporting(&["train", "history", "series"])
    .boxed()
}

async fn run_step(
    c: TrainConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let dataset = cx.input("dataset")?;
    let data = crate::table::split(dataset, "train").await?;
    let (model, mut history) = tokio::task::block_in_place(|| {
        train(
            &c,
            &data,
            cx.rank,
            cx.world,
            cx.master.as_deref(),
            cx.checkpoints.as_deref(),
        )
    })?;
    if cx.rank != 0 {
        return Ok(serde_json::Value::Null);
    }
    let metrics = crate::model::evaluate(&model, &data);
    std::fs::write(
        cx.output("model")?.join("model.json"),
        serde_json::to_vec_pretty(&model)?,
    )?;
    if let Some(m) = cx.outputs.get("metrics") {
        std::fs::write(
            m.join("metrics.json"),
            serde_json::to_vec_pretty(&serde_json::json!({"train": metrics, "history": history}))?,
        )?;
    }
    println!(
        "trained on {} frames over {} rank(s): train f1 {:.3}",
        data.len(),
        cx.world,
        metrics["f1"].as_f64().unwrap_or(0.0)
    );
    // The per-epoch series at the top, where the web view looks (docs/spec.md).
    let series = history.as_object_mut().and_then(|h| h.remove("series"));
    Ok(serde_json::json!({"train": metrics, "history": history, "series": series}))
}

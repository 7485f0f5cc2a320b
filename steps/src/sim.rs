//! `fleet-sim`: synthetic fleet drive logs as MCAP files, JSON-schema channels that
//! Foxglove opens as they are.
//!
//! Each drive is one file, `drive-NNN.mcap`, with these channels (message encoding
//! `json`, schema encoding `jsonschema`; or, by `encoding:`, the same values as protobuf
//! or ROS 2 CDR, see [`crate::sim_encode`]):
//!
//! | topic | rate | fields |
//! |---|---|---|
//! | `/vehicle` | `rate_hz` | `speed_mps`, `accel_x`, `accel_y`, `yaw_rate`, `steering`, `brake_pressure`, `lat`, `lon` |
//! | `/lane` | `rate_hz` | `lateral_offset_m`, `lane_confidence` |
//! | `/objects` | `rate_hz` | the nearest object: `class` (`car`, `truck`, `pedestrian`, `cyclist`), `distance_m`, `rel_speed_mps` |
//! | `/context` | 1 Hz | `weather` (`clear`, `rain`, `fog`), `time_of_day` (`day`, `dusk`, `night`) |
//! | `/ground_truth` | `rate_hz` | which injected events are active: `hard_brake`, `cut_in`, `pedestrian_close_call`, `low_lane_confidence` |
//!
//! Rare events are injected at the configured rates (per minute of driving): hard braking
//! (−5 to −8 m/s²), cut-ins (a car 4–9 m ahead, closing), pedestrian close calls (3–7 m),
//! low lane confidence (more likely at night and in rain). The same seed writes the same
//! bytes.

use std::collections::BTreeMap;
use std::io::BufWriter;
use std::path::Path;

use serde_json::{json, Value};

use crate::rng::Rng;
use crate::sim_encode::Channel;
pub use crate::sim_encode::SimEncoding;

/// What the simulator wrote.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SimSummary {
    pub drives: u32,
    pub frames: u64,
    pub events: BTreeMap<String, u64>,
}

const TOPICS: &[(&str, &str)] = &[
    (
        "/vehicle",
        r#"{"type":"object","title":"Vehicle","properties":{"speed_mps":{"type":"number"},"accel_x":{"type":"number"},"accel_y":{"type":"number"},"yaw_rate":{"type":"number"},"steering":{"type":"number"},"brake_pressure":{"type":"number"},"lat":{"type":"number"},"lon":{"type":"number"}}}"#,
    ),
    (
        "/lane",
        r#"{"type":"object","title":"Lane","properties":{"lateral_offset_m":{"type":"number"},"lane_confidence":{"type":"number"}}}"#,
    ),
    (
        "/objects",
        r#"{"type":"object","title":"NearestObject","properties":{"class":{"type":"string"},"distance_m":{"type":"number"},"rel_speed_mps":{"type":"number"}}}"#,
    ),
    (
        "/context",
        r#"{"type":"object","title":"Context","properties":{"weather":{"type":"string"},"time_of_day":{"type":"string"}}}"#,
    ),
    (
        "/ground_truth",
        r#"{"type":"object","title":"GroundTruth","properties":{"hard_brake":{"type":"boolean"},"cut_in":{"type":"boolean"},"pedestrian_close_call":{"type":"boolean"},"low_lane_confidence":{"type":"boolean"}}}"#,
    ),
];

/// The injected event kinds, with how long each lasts (seconds).
pub const EVENTS: &[(&str, f64)] = &[
    ("hard_brake", 2.0),
    ("cut_in", 1.5),
    ("pedestrian_close_call", 1.5),
    ("low_lane_confidence", 3.0),
];

/// 2026-01-01T08:00:00Z: drives start here, one hour apart, so log times are stable.
const EPOCH_NS: u64 = 1_767_254_400_000_000_000;

/// Writes the drives of `cfg` into `dir`.
pub fn simulate(cfg: &FleetSimConfig, dir: &Path) -> anyhow::Result<SimSummary> {
    let drives = cfg.drives.unwrap_or(4);
    let seconds = match &cfg.duration {
        Some(d) => drivetrain_engine::units::parse_duration(d)
            .map_err(|e| anyhow::anyhow!("duration: {e}"))?
            .as_secs_f64(),
        None => 120.0,
    };
    let rate = cfg.rate_hz.unwrap_or(10.0);
    if !(1.0..=100.0).contains(&rate) {
        anyhow::bail!("rate_hz must be between 1 and 100, got {rate}");
    }
    let rates = cfg.events.as_ref();
    let per_minute = |kind: &str| -> f64 {
        let r = rates.and_then(|e| match kind {
            "hard_brake" => e.hard_brake,
            "cut_in" => e.cut_in,
            "pedestrian_close_call" => e.pedestrian_close_call,
            _ => e.low_lane_confidence,
        });
        r.unwrap_or(0.3)
    };
    let root = Rng::new(cfg.seed.unwrap_or(0));
    let mut summary = SimSummary {
        drives,
        ..Default::default()
    };
    for d in 0..drives {
        let shape = Shape {
            seconds,
            rate,
            encoding: cfg.encoding.unwrap_or_default(),
        };
        write_drive(d, &root, dir, &shape, &per_minute, &mut summary)?;
    }
    Ok(summary)
}

/// How long each drive is, how often it has a frame, how its messages are written.
struct Shape {
    seconds: f64,
    rate: f64,
    encoding: SimEncoding,
}

/// Writes drive `d` (`drive-00d.mcap` in `dir`): `seconds` of frames at `rate`, events
/// at `per_minute(kind)`, counted into `summary`.
fn write_drive(
    d: u32,
    root: &Rng,
    dir: &Path,
    shape: &Shape,
    per_minute: &dyn Fn(&str) -> f64,
    summary: &mut SimSummary,
) -> anyhow::Result<()> {
    let (seconds, rate, encoding) = (shape.seconds, shape.rate, shape.encoding);
    let mut rng = root.fork(u64::from(d) + 1);
    let path = dir.join(format!("drive-{d:03}.mcap"));
    let file = std::fs::File::create(&path)?;
    let mut w = mcap::WriteOptions::new()
        .compression(Some(mcap::Compression::Zstd))
        .profile("")
        .library("drivetrain fleet-sim")
        .create(BufWriter::new(file))?;
    let mut channels = Vec::new();
    for (topic, schema) in TOPICS {
        let c = Channel::new(encoding, topic, schema)?;
        let sid = w.add_schema(&c.schema_name, c.schema_encoding, &c.schema)?;
        let id = w.add_channel(sid, topic, c.message_encoding, &BTreeMap::new())?;
        channels.push((id, c));
    }
    let weather = *rng.pick(&["clear", "clear", "clear", "rain", "fog"]);
    let time_of_day = *rng.pick(&["day", "day", "dusk", "night"]);
    let highway = rng.chance(0.5);
    let cruise = if highway { 27.0 } else { 12.0 } + rng.range(-2.0, 2.0);
    let mut speed = cruise;
    let (mut lat, mut lon) = (
        48.13 + rng.range(-0.05, 0.05),
        11.57 + rng.range(-0.05, 0.05),
    );
    let mut heading = rng.range(0.0, std::f64::consts::TAU);
    let mut offset: f64 = 0.0;
    let mut lead = rng.range(20.0, 60.0);
    // Remaining frames of each active event.
    let mut active: BTreeMap<&str, u32> = BTreeMap::new();
    let dt = 1.0 / rate;
    let frames = (seconds * rate) as u64;
    let start = EPOCH_NS + u64::from(d) * 3_600_000_000_000;
    let mut seq = 0u32;
    for i in 0..frames {
        let t = i as f64 * dt;
        let log_time = start + (t * 1e9) as u64;
        let poor_view = weather != "clear" || time_of_day == "night";
        start_events(&mut rng, &mut active, per_minute, rate, poor_view, summary);
        let on = |k: &str| active.contains_key(k);
        // Vehicle dynamics: speed relaxes to cruise, braking events override.
        let mut accel = 0.3 * (cruise - speed) + 0.3 * rng.normal();
        if on("hard_brake") {
            accel = rng.range(-8.0, -5.0);
        }
        speed = (speed + accel * dt).max(0.0);
        let steering = 0.05 * (t / 7.0).sin()
            + 0.01 * rng.normal()
            + if rng.chance(0.002) {
                rng.range(-0.6, 0.6)
            } else {
                0.0
            };
        let yaw_rate = speed * steering / 2.8;
        heading += yaw_rate * dt;
        lat += speed * dt * heading.cos() / 111_320.0;
        lon += speed * dt * heading.sin() / (111_320.0 * lat.to_radians().cos());
        offset = (offset + 0.02 * rng.normal()).clamp(-1.5, 1.5) * 0.995;
        let mut confidence = match (weather, time_of_day) {
            ("clear", "day") => 0.92,
            ("clear", _) => 0.8,
            (_, "night") => 0.6,
            _ => 0.7,
        } + 0.04 * rng.normal();
        if on("low_lane_confidence") {
            confidence = rng.range(0.1, 0.3);
        }
        lead = (lead + rng.normal() * 0.5).clamp(10.0, 80.0);
        let (class, distance, rel) = nearest_object(&mut rng, &on, highway, speed, lead);
        let messages: [Option<Value>; 5] = [
            Some(json!({
                "speed_mps": round(speed), "accel_x": round(accel),
                "accel_y": round(speed * yaw_rate), "yaw_rate": round(yaw_rate),
                "steering": round(steering), "brake_pressure": round(if accel < 0.0 { -accel * 12.0 } else { 0.0 }),
                "lat": lat, "lon": lon,
            })),
            Some(
                json!({"lateral_offset_m": round(offset), "lane_confidence": round(confidence.clamp(0.0, 1.0))}),
            ),
            Some(
                json!({"class": class, "distance_m": round(distance), "rel_speed_mps": round(rel)}),
            ),
            (i % rate.max(1.0) as u64 == 0)
                .then(|| json!({"weather": weather, "time_of_day": time_of_day})),
            Some(json!({
                "hard_brake": on("hard_brake"), "cut_in": on("cut_in"),
                "pedestrian_close_call": on("pedestrian_close_call"),
                "low_lane_confidence": on("low_lane_confidence"),
            })),
        ];
        write_frame(&mut w, &channels, messages, &mut seq, log_time)?;
        active.retain(|_, left| {
            *left = left.saturating_sub(1);
            *left > 0
        });
        summary.frames += 1;
    }
    w.finish()?;
    Ok(())
}

/// The object ahead: a pedestrian or a car cutting in during those events, else the lead
/// car (sometimes a truck on a highway): its class, distance and relative speed.
fn nearest_object(
    rng: &mut Rng,
    on: &dyn Fn(&str) -> bool,
    highway: bool,
    speed: f64,
    lead: f64,
) -> (&'static str, f64, f64) {
    if on("pedestrian_close_call") {
        ("pedestrian", rng.range(3.0, 7.0), -speed.min(5.0))
    } else if on("cut_in") {
        ("car", rng.range(4.0, 9.0), rng.range(-4.0, -1.0))
    } else {
        let class = if highway && rng.chance(0.2) {
            "truck"
        } else {
            "car"
        };
        (class, lead, rng.range(-1.0, 1.0))
    }
}

/// Starts each event that is not on with its chance in one frame at `rate` (low lane
/// confidence three times as often where the view is poor), counted into `summary`.
fn start_events(
    rng: &mut Rng,
    active: &mut BTreeMap<&'static str, u32>,
    per_minute: &dyn Fn(&str) -> f64,
    rate: f64,
    poor_view: bool,
    summary: &mut SimSummary,
) {
    let dt = 1.0 / rate;
    for (kind, length) in EVENTS {
        let mut p = per_minute(kind) / 60.0 * dt;
        if *kind == "low_lane_confidence" && poor_view {
            p *= 3.0;
        }
        if !active.contains_key(kind) && rng.chance(p) {
            active.insert(kind, (length * rate) as u32);
            *summary.events.entry((*kind).to_owned()).or_default() += 1;
        }
    }
}

/// Writes one frame's messages (those it has) on their channels, numbered on from `seq`.
fn write_frame<W: std::io::Write + std::io::Seek>(
    w: &mut mcap::Writer<W>,
    channels: &[(u16, Channel)],
    messages: [Option<Value>; 5],
    seq: &mut u32,
    log_time: u64,
) -> anyhow::Result<()> {
    for ((id, c), m) in channels.iter().zip(messages) {
        let Some(m) = m else { continue };
        *seq += 1;
        w.write_to_known_channel(
            &mcap::records::MessageHeader {
                channel_id: *id,
                sequence: *seq,
                log_time,
                publish_time: log_time,
            },
            &c.encode(&m)?,
        )?;
    }
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

// The `fleet-sim` step: its `with:` block, registration and what it does with its context.

/// `fleet-sim`: synthetic drives.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetSimConfig {
    /// Number of drives. Default 4.
    #[serde(default)]
    pub drives: Option<u32>,
    /// Length of each drive, as a duration (`10m`). Default `2m`.
    #[serde(default)]
    pub duration: Option<String>,
    /// Signal rate in Hz (10 to 20). Default 10.
    #[serde(default)]
    pub rate_hz: Option<f64>,
    /// Seed; the same seed writes the same bytes.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Rare events per minute of driving, by kind.
    #[serde(default)]
    pub events: Option<EventRates>,
    /// How messages are written: `json` (default; JSON Schema channels Foxglove opens as
    /// they are), `protobuf` (a `FileDescriptorSet` per channel) or `ros2` (`ros2msg`
    /// definitions, CDR payloads). The values are the same in each.
    #[serde(default)]
    pub encoding: Option<SimEncoding>,
}

/// Injected event rates, per minute.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EventRates {
    #[serde(default)]
    pub hard_brake: Option<f64>,
    #[serde(default)]
    pub cut_in: Option<f64>,
    #[serde(default)]
    pub pedestrian_close_call: Option<f64>,
    #[serde(default)]
    pub low_lane_confidence: Option<f64>,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<FleetSimConfig>(
        "fleet-sim",
        "write synthetic fleet drive logs (MCAP) with rare events injected",
        &[],
        &["logs"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .reporting(&["drives", "frames", "events"])
    .boxed()
}

async fn run_step(
    c: FleetSimConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let out = cx.output("logs")?.clone();
    let s = tokio::task::block_in_place(|| simulate(&c, &out))?;
    println!(
        "simulated {} drives, {} frames, events {:?}",
        s.drives, s.frames, s.events
    );
    Ok(serde_json::json!({"drives": s.drives, "frames": s.frames, "events": s.events}))
}

//! Frames from a declared mapping (`with: frames:`): one frame per message of the clock
//! topic, each mapped column read by its field path from its topic's latest message at or
//! before the frame (the clock topic's own fields from the frame's own message), a held
//! value older than `hold.max_age` null. The age columns say how old the stalest message
//! feeding their group is (`lane_age_s` for the lane columns, and so on), null before the
//! first.
//!
//! A path a schema'd message (protobuf, ROS) does not have is an error naming what the
//! message has at that level; a JSON message simply lacks it (null), as in the default
//! layout.

use std::collections::HashMap;

use indexmap::IndexMap;

use super::fields::{Invalid, Raw};
use super::frames::{DriveWriter, Held, Pending, Slot};
use crate::decode::{Dyn, Path};

/// `with: frames:` of `ingest`: which topic clocks the frames and where each column
/// comes from.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FramesConfig {
    /// One frame per message of this topic.
    pub clock: String,
    /// Frame column → `topic.field.path` (`/imu/data.linear_acceleration.x`,
    /// `/odom.pose.covariance[0]`): the topic up to the first `.`, then fields and `[N]`
    /// indexes. Columns not named are null.
    pub fields: IndexMap<String, String>,
    /// How long a value of another topic is held onto the frames after it.
    #[serde(default)]
    pub hold: Option<HoldConfig>,
}

/// `hold:` of a mapping.
#[derive(Debug, Clone, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldConfig {
    /// A held value older than this (`200ms`, `2s`) is null; its age stays a column.
    pub max_age: String,
}

/// One mapped column.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    slot: Slot,
    topic: String,
    path: Path,
}

/// A checked mapping.
#[derive(Debug, Clone)]
pub(super) struct Mapping {
    pub(super) clock: String,
    columns: Vec<Column>,
    max_age: Option<u64>,
}

impl Mapping {
    /// Checks `cfg`, giving (`frames.…` location, message) for each fault.
    pub(super) fn new(cfg: &FramesConfig) -> Result<Mapping, Vec<(String, String)>> {
        let mut faults = Vec::new();
        let mut columns = Vec::new();
        if !cfg.clock.starts_with('/') && cfg.clock.contains('.') {
            faults.push((
                "frames.clock".into(),
                format!(
                    "`{}` is a topic, not a field: write the topic alone",
                    cfg.clock
                ),
            ));
        }
        for (name, spec) in &cfg.fields {
            let at = format!("frames.fields.{name}");
            let Some(slot) = Slot::of(name) else {
                faults.push((
                    at,
                    format!(
                        "`{name}` is not a column a mapping fills; the frame table's are: {}",
                        Slot::columns().join(", ")
                    ),
                ));
                continue;
            };
            let Some((topic, path)) = spec.split_once('.') else {
                faults.push((at, format!("`{spec}` names no field: write `topic.field` (`/imu/data.linear_acceleration.x`)")));
                continue;
            };
            match path.parse::<Path>() {
                Ok(path) => columns.push(Column {
                    name: name.clone(),
                    slot,
                    topic: topic.to_owned(),
                    path,
                }),
                Err(e) => faults.push((at, e)),
            }
        }
        let max_age = match &cfg.hold {
            Some(h) => match humantime::parse_duration(&h.max_age) {
                Ok(d) => Some(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                Err(e) => {
                    faults.push((
                        "frames.hold.max_age".into(),
                        format!("`{}` is not a duration like `200ms`: {e}", h.max_age),
                    ));
                    None
                }
            },
            None => None,
        };
        if !faults.is_empty() {
            return Err(faults);
        }
        Ok(Mapping {
            clock: cfg.clock.clone(),
            columns,
            max_age,
        })
    }

    /// [`Mapping::new`] with its faults as one error.
    pub(super) fn checked(cfg: &FramesConfig) -> anyhow::Result<Mapping> {
        Mapping::new(cfg).map_err(|faults| {
            let all: Vec<String> = faults.iter().map(|(at, m)| format!("{at}: {m}")).collect();
            anyhow::anyhow!("{}", all.join("; "))
        })
    }

    /// Whether messages of `topic` make frames: only these are decoded.
    pub(super) fn reads(&self, topic: &str) -> bool {
        topic == self.clock || self.columns.iter().any(|c| c.topic == topic)
    }

    /// The topics the mapping reads, the clock first.
    pub(super) fn topics(&self) -> Vec<&str> {
        let mut out = vec![self.clock.as_str()];
        for c in &self.columns {
            if !out.contains(&c.topic.as_str()) {
                out.push(&c.topic);
            }
        }
        out
    }

    #[cfg(test)]
    fn max_age(&self) -> Option<std::time::Duration> {
        self.max_age.map(std::time::Duration::from_nanos)
    }
}

/// Builds one drive's frames by a mapping from decoded messages in log-time order.
pub(super) struct MappedBuilder {
    writer: DriveWriter,
    map: Mapping,
    /// The latest message of each non-clock topic: its log time and its columns.
    held: HashMap<String, (u64, Held)>,
    pending: Vec<Pending>,
    pub(super) invalid: Invalid,
}

impl MappedBuilder {
    pub(super) fn new(writer: DriveWriter, map: Mapping) -> MappedBuilder {
        MappedBuilder {
            writer,
            map,
            held: HashMap::new(),
            pending: Vec::new(),
            invalid: Invalid::default(),
        }
    }

    /// Takes one decoded message of a topic the mapping reads; `schemad` says whether
    /// its channel has a schema that fixes its fields (a path it lacks is then an error).
    pub(super) fn message(
        &mut self,
        topic: &str,
        log_time: u64,
        offset: u64,
        chunk_offset: Option<u64>,
        msg: &Dyn,
        schemad: bool,
    ) -> anyhow::Result<()> {
        if self.pending.first().is_some_and(|p| log_time > p.log_time) {
            self.flush_pending()?;
        }
        let mut row = Held::default();
        for c in self.map.columns.iter().filter(|c| c.topic == topic) {
            let raw = match msg.at(&c.path.segs) {
                Ok(v) => Raw::of_dyn(&v),
                Err(_) if !schemad => Raw::Absent,
                Err(depth) => anyhow::bail!(
                    "frames.fields.{}: `{topic}` has no `{}`; {} has {}",
                    c.name,
                    c.path,
                    match depth {
                        0 => "its message".to_owned(),
                        n => format!("`{}`", c.path.upto(n)),
                    },
                    parent(msg, &c.path, depth).describe()
                ),
            };
            row.set(c.slot, &raw, &mut self.invalid, topic, &c.path.to_string());
        }
        if topic == self.map.clock {
            self.pending.push(Pending {
                log_time,
                offset,
                chunk_offset,
                own: row,
            });
        } else {
            self.held.insert(topic.to_owned(), (log_time, row));
        }
        Ok(())
    }

    fn flush_pending(&mut self) -> anyhow::Result<()> {
        for p in std::mem::take(&mut self.pending) {
            let mut frame = p.own;
            for c in self
                .map
                .columns
                .iter()
                .filter(|c| c.topic != self.map.clock)
            {
                let Some((since, held)) = self.held.get(&c.topic) else {
                    continue;
                };
                let age = p.log_time.saturating_sub(*since);
                if self.map.max_age.is_none_or(|max| age <= max) {
                    frame.copy(held, c.slot);
                }
                if let Some(group) = c.slot.age_group() {
                    frame.aged(group, *since);
                }
            }
            self.writer
                .push(p.log_time, p.offset, p.chunk_offset, &frame)?;
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> anyhow::Result<(u64, Invalid)> {
        self.flush_pending()?;
        Ok((self.writer.finish()?, self.invalid))
    }
}

/// The value where `path` stopped after `depth` segments.
fn parent(msg: &Dyn, path: &Path, depth: usize) -> Dyn {
    msg.at(&path.segs[..depth]).unwrap_or(Dyn::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(fields: &[(&str, &str)], hold: Option<&str>) -> FramesConfig {
        FramesConfig {
            clock: "/odom".into(),
            fields: fields
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
            hold: hold.map(|h| HoldConfig { max_age: h.into() }),
        }
    }

    #[test]
    fn a_mapping_names_its_faults_where_they_are() {
        let faults = Mapping::new(&cfg(
            &[
                ("speed", "/odom.twist.x"),
                ("accel_x", "/imu"),
                ("yaw_rate", "/imu.a[x]"),
            ],
            Some("soon"),
        ))
        .unwrap_err();
        let at: Vec<&str> = faults.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(
            at,
            [
                "frames.fields.speed",
                "frames.fields.accel_x",
                "frames.fields.yaw_rate",
                "frames.hold.max_age"
            ]
        );
        assert!(faults[0].1.contains("speed_mps"), "{}", faults[0].1);
        let m = Mapping::new(&cfg(
            &[
                ("speed_mps", "/odom.twist.linear.x"),
                ("accel_x", "/imu/data.linear_acceleration.x"),
            ],
            Some("200ms"),
        ))
        .unwrap();
        assert_eq!(m.topics(), ["/odom", "/imu/data"]);
        assert!(m.reads("/imu/data") && !m.reads("/imu"));
        assert_eq!(m.max_age(), Some(std::time::Duration::from_millis(200)));
    }
}

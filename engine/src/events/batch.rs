//! When waiting objects become a run: a pure decision over the inbox's counts, so the
//! server, `trigger show` and the tests weigh the same way.

use chrono::{DateTime, Utc};

use super::Trigger;
use crate::state::Waiting;

/// What to do with one group of waiting objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start a run with up to `max` of the group's objects, if at least `min` are still
    /// waiting when it is claimed.
    Fire {
        group: String,
        min: usize,
        max: usize,
        why: String,
    },
    /// Not yet.
    Wait { group: String, why: String },
}

/// The decision for each group with waiting objects, oldest group first; `paused`
/// decides nothing but says so.
pub fn decide(t: &Trigger, waiting: &[Waiting], now: DateTime<Utc>, paused: bool) -> Vec<Decision> {
    waiting
        .iter()
        .map(|w| {
            let group = w.group.clone();
            let in_group = match group.is_empty() {
                true => String::new(),
                false => format!(" in group `{group}`"),
            };
            let count = w.count as usize;
            let waited = DateTime::parse_from_rfc3339(&w.oldest)
                .map(|t| (now - t.with_timezone(&Utc)).to_std().unwrap_or_default())
                .unwrap_or_default();
            if paused {
                return Decision::Wait {
                    group,
                    why: format!("paused: {count} object(s) queued{in_group}"),
                };
            }
            if count >= t.min_items {
                return Decision::Fire {
                    group,
                    min: t.min_items,
                    max: t.max_items,
                    why: format!(
                        "{count} object(s) waiting{in_group}, min_items {}",
                        t.min_items
                    ),
                };
            }
            match t.max_wait {
                Some(max_wait) if waited >= max_wait => Decision::Fire {
                    group,
                    min: 1,
                    max: t.max_items,
                    why: format!(
                        "the oldest of {count} object(s){in_group} waited {} (max_wait {})",
                        humantime::format_duration(std::time::Duration::from_secs(
                            waited.as_secs()
                        )),
                        humantime::format_duration(max_wait)
                    ),
                },
                _ => Decision::Wait {
                    group,
                    why: format!(
                        "{count} of min_items {} waiting{in_group}{}",
                        t.min_items,
                        match t.max_wait {
                            Some(m) => format!(
                                ", the oldest for {} of max_wait {}",
                                humantime::format_duration(std::time::Duration::from_secs(
                                    waited.as_secs()
                                )),
                                humantime::format_duration(m)
                            ),
                            None => String::new(),
                        }
                    ),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn trigger(min: usize, max: usize, max_wait: Option<u64>) -> Trigger {
        Trigger {
            name: "t".into(),
            watch: super::super::Watch::After(super::super::After {
                pipeline: "up".into(),
                phases: vec![],
            }),
            min_items: min,
            max_items: max,
            max_wait: max_wait.map(Duration::from_secs),
            group_by: None,
            params: Default::default(),
            paused: false,
        }
    }

    fn waiting(group: &str, count: u64, oldest: &str) -> Waiting {
        Waiting {
            group: group.into(),
            count,
            oldest: oldest.into(),
        }
    }

    #[test]
    fn fires_at_min_items_or_after_max_wait_whichever_first() {
        let now = DateTime::parse_from_rfc3339("2026-11-26T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let t = trigger(50, 500, Some(6 * 3600));
        // 49 waiting for 1 h: wait.
        let d = decide(&t, &[waiting("", 49, "2026-11-26T11:00:00Z")], now, false);
        assert!(
            matches!(&d[0], Decision::Wait { why, .. } if why.contains("49 of min_items 50")),
            "{d:?}"
        );
        // 50: fire, and the claim must still find 50.
        let d = decide(&t, &[waiting("", 50, "2026-11-26T11:59:59Z")], now, false);
        assert_eq!(
            d[0],
            Decision::Fire {
                group: "".into(),
                min: 50,
                max: 500,
                why: "50 object(s) waiting, min_items 50".into()
            }
        );
        // 3 waiting for 6 h: fire with what there is.
        let d = decide(
            &t,
            &[waiting("veh7", 3, "2026-11-26T06:00:00Z")],
            now,
            false,
        );
        assert!(
            matches!(&d[0], Decision::Fire { min: 1, group, .. } if group == "veh7"),
            "{d:?}"
        );
        // Paused: never.
        let d = decide(&t, &[waiting("", 900, "2026-11-20T06:00:00Z")], now, true);
        assert!(
            matches!(&d[0], Decision::Wait { why, .. } if why.starts_with("paused")),
            "{d:?}"
        );
    }
}

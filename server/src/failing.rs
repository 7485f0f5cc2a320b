//! A trigger's source that keeps failing (no credentials, a bucket that is not there, a
//! queue that refuses): tried again at its usual pace once (a passing fault), then after
//! 2 s, doubling to 5 minutes, and said once per kind of failure, the first time with
//! what to do; said again when it recovers.

use std::time::{Duration, Instant};

const FIRST: Duration = Duration::from_secs(2);
const MOST: Duration = Duration::from_secs(300);

/// What one of a trigger's loops knows of its source's failures.
#[derive(Debug, Default)]
pub(crate) struct Failing {
    /// The last failure said, and how many times it has failed since the last success.
    said: Option<String>,
    times: u32,
    next_try: Option<Instant>,
    hinted: bool,
}

impl Failing {
    /// Whether the source may be tried now.
    pub(crate) fn may_try(&self) -> bool {
        self.next_try.is_none_or(|t| Instant::now() >= t)
    }

    /// How long to wait before the next try (zero when it may be tried).
    pub(crate) fn wait(&self) -> Duration {
        self.next_try
            .map(|t| t.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
    }

    /// Records a failure: what to print, if anything (a failure unlike the last one
    /// said, the first with `hint`).
    pub(crate) fn failed(&mut self, error: &str, hint: &str) -> Option<String> {
        self.times += 1;
        let delay = match self.times {
            1 => Duration::ZERO,
            n => FIRST.saturating_mul(1 << (n - 2).min(8)).min(MOST),
        };
        self.next_try = Some(Instant::now() + delay);
        if self.said.as_deref() == Some(error) {
            return None;
        }
        self.said = Some(error.to_owned());
        let mut line = format!(
            "{error} (tried again, then less and less often up to every {} min; said again only when it changes)",
            MOST.as_secs() / 60
        );
        if !self.hinted {
            self.hinted = true;
            line.push_str("; ");
            line.push_str(hint);
        }
        Some(line)
    }

    /// Records a success: what to print, if the source had been failing.
    pub(crate) fn succeeded(&mut self) -> Option<String> {
        let was = std::mem::take(&mut self.times);
        self.next_try = None;
        self.said.take()?;
        Some(format!(
            "reachable again after {was} failed tr{}",
            if was == 1 { "y" } else { "ies" }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_said_once_and_tried_less_often() {
        let mut f = Failing::default();
        assert!(f.may_try());
        let first = f.failed("no credentials", "pause it").unwrap();
        assert!(
            first.contains("no credentials") && first.ends_with("pause it"),
            "{first}"
        );
        assert!(f.may_try(), "a passing fault is tried again at its pace");
        assert_eq!(f.failed("no credentials", "pause it"), None, "said once");
        assert!(!f.may_try() && f.wait() <= FIRST);
        f.failed("no credentials", "pause it");
        assert!(f.wait() > FIRST, "backs off");
        let other = f.failed("bucket gone", "pause it").unwrap();
        assert!(!other.contains("pause it"), "the hint once: {other}");
        for _ in 0..20 {
            f.failed("bucket gone", "pause it");
        }
        assert!(f.wait() <= MOST);
        assert_eq!(
            f.succeeded().unwrap(),
            "reachable again after 24 failed tries"
        );
        assert!(f.may_try());
        assert_eq!(f.succeeded(), None);
    }
}

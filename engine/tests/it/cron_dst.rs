//! Cron ticks across every daylight-saving change of several zones and years, compared
//! with an independent implementation: Python's `croniter` (from the venv `.ci/run`
//! installs; see `drivetrain_engine::testing::venv_bin`).
//!
//! Ticks are UTC instants. Around each change the ticks of a window are enumerated at
//! once and, as the scheduler meets them, one at a time from each tick (deciding inside
//! the first pass of a repeated hour lost the second pass before). Both must equal
//! croniter's, with two documented differences, applied to croniter's ticks here: a
//! schedule with a fixed hour (`30 2 * * *`) fires once at a wall-clock time that happens
//! twice, the first time (croniter fires it both times), as Vixie cron and systemd do
//! (schedules with any hour, `*/30 * * * *` or `0 * * * *`, fire on every instant through
//! the repeated hour, as croniter does); and a matching wall-clock time the clock skipped
//! always fires at the first instant after the gap (croniter does so for a one-hour gap
//! but drops `0 * * * *`'s 02:00 in Lord Howe's half-hour gap).

use std::io::Write;
use std::process::{Command, Stdio};

use chrono::{DateTime, Duration, Offset, TimeZone, Utc};
use drivetrain_engine::plan::Schedule;
use drivetrain_engine::schedule::Ticker;
use drivetrain_engine::spec::{Catchup, Concurrency};
use serde_json::{json, Value};

const ZONES: &[&str] = &[
    "Europe/Berlin",
    "America/Los_Angeles",
    "Australia/Sydney",
    "Australia/Lord_Howe", // a 30-minute change
    "America/St_Johns",    // a half-hour offset
    "America/Santiago",    // changes at midnight
];
const CRONS: &[&str] = &[
    "*/30 * * * *",
    "0 * * * *",
    "15 */2 * * *",
    "30 2 * * *",
    "0 1 * * *",
    "45 0,1,2,3 * * *",
    "0 0 * * *",
];

/// Every instant in `years` where `zone`'s UTC offset changes (to the minute).
fn transitions(zone: chrono_tz::Tz, years: std::ops::Range<i32>) -> Vec<DateTime<Utc>> {
    let offset = |t: DateTime<Utc>| zone.offset_from_utc_datetime(&t.naive_utc()).fix();
    let mut out = Vec::new();
    let mut t = Utc.with_ymd_and_hms(years.start, 1, 1, 0, 0, 0).unwrap();
    let end = Utc.with_ymd_and_hms(years.end, 1, 1, 0, 0, 0).unwrap();
    while t < end {
        let next = t + Duration::hours(1);
        if offset(t) != offset(next) {
            let mut m = t;
            while offset(m) == offset(t) {
                m += Duration::minutes(1);
            }
            out.push(m);
        }
        t = next;
    }
    out
}

/// croniter's ticks in (start, end] of each case.
fn croniter(cases: &[Value]) -> Vec<Vec<String>> {
    const SCRIPT: &str = r#"
import json, sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo
from croniter import croniter
out = []
for c in json.load(sys.stdin):
    start = datetime.fromisoformat(c["start"]).astimezone(ZoneInfo(c["zone"]))
    end = datetime.fromisoformat(c["end"])
    it = croniter(c["cron"], start)
    ticks = []
    while True:
        t = it.get_next(datetime).astimezone(timezone.utc)
        if t > end:
            break
        ticks.append(t.strftime("%Y-%m-%dT%H:%M:%SZ"))
    # The gap rule (see the module doc): a matching wall-clock time the clock skipped
    # fires at the first instant after the gap, the change itself.
    zone = ZoneInfo(c["zone"])
    change = datetime.fromisoformat(c["change"])
    before = (change - timedelta(minutes=1)).astimezone(zone).utcoffset()
    after = change.astimezone(zone).utcoffset()
    if after > before:
        wall = (change + before).replace(tzinfo=None)
        while wall < (change + after).replace(tzinfo=None):
            if croniter.match(c["cron"], wall):
                ticks.append(change.strftime("%Y-%m-%dT%H:%M:%SZ"))
                break
            wall += timedelta(minutes=1)
        ticks = sorted(set(ticks))
    # The fixed-hour rule (see the module doc): a wall-clock time seen twice fires once.
    if c["fixed_hour"]:
        seen, kept = set(), []
        for t in ticks:
            wall = datetime.fromisoformat(t.replace("Z", "+00:00")).astimezone(ZoneInfo(c["zone"])).replace(tzinfo=None)
            if wall not in seen:
                kept.append(t)
            seen.add(wall)
        ticks = kept
    out.append(ticks)
json.dump(out, sys.stdout)
"#;
    python(SCRIPT, cases)
}

/// What a Python script of the tests' venv prints (JSON) for `cases` on its stdin.
fn python(script: &str, cases: &[Value]) -> Vec<Vec<String>> {
    let mut child = Command::new(drivetrain_engine::testing::venv_bin("python"))
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the tests' venv python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_vec(cases).unwrap().as_slice())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "croniter failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[test]
fn ticks_match_croniter_across_every_clock_change() {
    let mut cases = Vec::new();
    for zone in ZONES {
        let tz: chrono_tz::Tz = zone.parse().unwrap();
        let changes = transitions(tz, 2025..2029);
        assert!(changes.len() >= 6, "{zone}: {changes:?}");
        for change in changes {
            for cron in CRONS {
                cases.push(json!({
                    "zone": zone, "cron": cron,
                    "change": text(change),
                    "start": text(change - Duration::hours(5)),
                    "end": text(change + Duration::hours(5)),
                    "fixed_hour": !cron.split(' ').nth(1).unwrap().contains('*'),
                }));
            }
        }
    }
    let expected = croniter(&cases);
    let mut failures = Vec::new();
    for (case, want) in cases.iter().zip(&expected) {
        let schedule = Schedule {
            cron: case["cron"].as_str().unwrap().to_owned(),
            timezone: case["zone"].as_str().unwrap().parse().unwrap(),
            concurrency: Concurrency::Allow,
            catchup: Catchup::All,
            max_catchup: 1000,
            suspend: false,
        };
        let ticker = Ticker::new(&schedule).unwrap();
        let at = |s: &Value| s.as_str().unwrap().parse::<DateTime<Utc>>().unwrap();
        let (start, end) = (at(&case["start"]), at(&case["end"]));
        let all: Vec<String> = ticker
            .between(start, end, 1000)
            .into_iter()
            .map(text)
            .collect();
        if &all != want {
            failures.push(format!("{case}: all at once {all:?}, croniter {want:?}"));
            continue;
        }
        // One at a time, as the scheduler decides: from each tick, the next.
        let mut t = start;
        let mut stepped = Vec::new();
        while let Some(next) = ticker.next_after(t).filter(|n| *n <= end) {
            stepped.push(text(next));
            t = next;
        }
        if &stepped != want {
            failures.push(format!(
                "{case}: one at a time {stepped:?}, croniter {want:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Regression (round 2): `@daily` and the other nicknames were refused ("has 1 fields"),
/// and `0 0 */2 * 1` fired on every odd day OR every Monday. Nicknames mean what croniter
/// (and cronie) make of them; day of month and day of week follow cronie's rule, which
/// ANDs them when either field starts with `*` and ORs them otherwise (cronie's
/// `DOM_STAR`/`DOW_STAR` flags). croniter ORs unless told `day_or=False`, so it is told
/// which, by that rule, per expression: the matching itself is croniter's.
#[test]
fn nicknames_and_day_fields_follow_cronie() {
    const SCRIPT: &str = r#"
import json, sys
from datetime import datetime, timezone
from croniter import croniter
out = []
for c in json.load(sys.stdin):
    start = datetime.fromisoformat(c["start"])
    end = datetime.fromisoformat(c["end"])
    it = croniter(c["cron"], start, day_or=c["day_or"])
    ticks = []
    while True:
        t = it.get_next(datetime).astimezone(timezone.utc)
        if t > end:
            break
        ticks.append(t.strftime("%Y-%m-%dT%H:%M:%SZ"))
    out.append(ticks)
json.dump(out, sys.stdout)
"#;
    let crons = [
        "@hourly",
        "@daily",
        "@midnight",
        "@weekly",
        "@monthly",
        "@yearly",
        "@annually",
        "0 0 */2 * 1",
        "0 0 1 * 1",
        "30 6 1,15 * 5",
        "0 12 * * */2",
        "0 0 */10 * 0",
        "15 3 1-7 * 1",
        "0 0 * * 1",
    ];
    let (start, end) = ("2026-01-01T00:00:00Z", "2027-03-01T00:00:00Z");
    let cases: Vec<Value> = crons
        .iter()
        .map(|cron| {
            let f: Vec<&str> = cron.split_whitespace().collect();
            let day_or = f.len() != 5 || !(f[2].starts_with('*') || f[4].starts_with('*'));
            json!({"cron": cron, "start": start, "end": end, "day_or": day_or})
        })
        .collect();
    let expected = python(SCRIPT, &cases);
    for (cron, want) in crons.iter().zip(&expected) {
        let schedule = Schedule {
            cron: cron.to_string(),
            timezone: chrono_tz::UTC,
            concurrency: Concurrency::Allow,
            catchup: Catchup::All,
            max_catchup: 100_000,
            suspend: false,
        };
        let ticker = Ticker::new(&schedule).unwrap_or_else(|e| panic!("{cron}: {e}"));
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let got: Vec<String> = ticker
            .between(at(start), at(end), 100_000)
            .into_iter()
            .map(text)
            .collect();
        assert!(!got.is_empty(), "{cron}");
        assert_eq!(&got, want, "{cron}");
    }
    // The case of the report, spelled out: odd days of the month that are Mondays.
    let ticker = Ticker::new(&Schedule {
        cron: "0 0 */2 * 1".into(),
        timezone: chrono_tz::UTC,
        concurrency: Concurrency::Allow,
        catchup: Catchup::All,
        max_catchup: 100,
        suspend: false,
    })
    .unwrap();
    use chrono::Datelike;
    for t in ticker.between(
        "2026-01-01T00:00:00Z".parse().unwrap(),
        "2026-07-01T00:00:00Z".parse().unwrap(),
        100,
    ) {
        assert_eq!(t.weekday(), chrono::Weekday::Mon, "{t}");
        assert_eq!(t.day() % 2, 1, "{t}");
    }
    assert!(drivetrain_engine::schedule::parse_cron("@reboot").is_err());
    assert!(drivetrain_engine::schedule::parse_cron("0 0 * *").is_err());
}

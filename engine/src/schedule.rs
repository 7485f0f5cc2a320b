//! Cron ticks: which scheduled times are due, decided against the ticks the state store
//! already recorded, with the time passed in (a test clock, or the wall clock in `serve`).
//!
//! A tick's id is the pipeline and its scheduled time (`nightly@2026-03-29T01:00:00Z`),
//! and it is claimed in the state store (an insert that only one caller can win) before
//! its run starts, with the run's id decided at the same time. So a restarted server never
//! fires a tick twice, and a tick claimed by an engine that died before starting its run
//! is found by its id and started then.
//!
//! Which ticks fire after downtime follows the schedule's `catchup`: ticks between the
//! last recorded one (or the moment the schedule was registered or resumed) and now; the
//! newest counts as on time when it is younger than [`ON_TIME`], the rest were missed.
//! `none` fires only an on-time tick; `latest` the newest; `all` every missed tick up to
//! `max_catchup` (the newest ones) and the on-time one. Ticks not fired are recorded as
//! skipped, with why. Ticks are UTC instants; across daylight-saving changes a time that
//! does not exist (spring forward) fires at the first minute after the gap, and a time
//! that exists twice (fall back) fires twice for interval jobs (hour `*` or `*/N`) and
//! once for a fixed hour (see [`Ticker`]; `tests/it/cron_dst.rs` compares with croniter).
//! Expressions are read as cronie reads them ([`parse_cron`]): nicknames (`@daily`,
//! `@midnight`, …), and day of month and day of week ORed only when neither starts with
//! `*`.

use chrono::{DateTime, Duration, NaiveDateTime, SubsecRound, Utc};

use crate::plan::Schedule;
use crate::spec::{Catchup, Concurrency};
use crate::state::{RunId, RunRecord, StateError, StateStore, TickRecord};

/// A tick this much older than now was missed, not merely noticed late.
pub const ON_TIME: Duration = Duration::seconds(60);

/// Enumerates a schedule's ticks as UTC instants.
///
/// croner matches the expression against local wall-clock times (walked as if they were
/// UTC, so it never meets a clock change); each matching wall-clock time is then mapped
/// to the instants it names in the schedule's zone. A time that exists once is one tick.
/// A time the clock skipped (spring forward) is a tick at the first instant after the
/// gap (once, however many skipped times match). A time that exists twice (fall back) is
/// two ticks when the hour field is a wildcard or a step (`*`, `*/2`: interval jobs keep
/// their pace through the repeated hour) and one tick, the first, when the hour is fixed
/// (`30 2 * * *` runs once a day), as Vixie cron and systemd do.
#[derive(Debug, Clone)]
pub struct Ticker {
    cron: croner::Cron,
    timezone: chrono_tz::Tz,
    /// The hour field is a wildcard or step: repeated wall-clock times fire twice.
    every_hour: bool,
}

/// Whether the hour field of `expr` (five fields, or six with seconds first) is a
/// wildcard or a step; of the nicknames, only `@hourly`.
fn hour_is_interval(expr: &str) -> bool {
    let e = expr.trim();
    if let Some(nick) = e.strip_prefix('@') {
        return nick.eq_ignore_ascii_case("hourly");
    }
    let fields: Vec<&str> = e.split_whitespace().collect();
    let hour = match fields.len() {
        n if n >= 6 => fields[2],
        _ => fields.get(1).copied().unwrap_or("*"),
    };
    hour.contains('*')
}

/// What a cron expression is wrong in.
#[derive(Debug, Clone, PartialEq)]
pub enum CronError {
    /// Not 5 or 6 fields (nor a nickname).
    Fields(usize),
    /// `@something` that is not a nickname.
    Nickname,
    /// A field that does not parse.
    Invalid(String),
    /// Six fields, seconds first, not asked for with `seconds: true`; what they would fire.
    Seconds { cadence: String },
}

impl std::error::Error for CronError {}

impl std::fmt::Display for CronError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CronError::Fields(n) => write!(f, "has {n} fields; a cron expression has 5 (minute hour day month weekday) or 6 (seconds first), or is a nickname (@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually)"),
            CronError::Nickname => write!(f, "is not a cron nickname: @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually"),
            CronError::Invalid(e) => write!(f, "is not a valid cron expression: {e}"),
            CronError::Seconds { cadence } => write!(f, "has 6 fields, which read seconds first and fire {cadence}; a cron expression has 5 (minute hour day month weekday): drop the extra field, or say `seconds: true` to mean it"),
        }
    }
}

/// Parses a cron expression as cronie (Vixie cron) reads it: five fields, or six with
/// seconds first, or a nickname (`@daily`, `@midnight`, …). Day of month and day of week
/// are ORed when both are restricted (`0 0 1 * 1`: the 1st and every Monday) and ANDed
/// when either starts with `*` (`0 0 */2 * 1`: odd days that are Mondays), as cronie's
/// `DOM_STAR`/`DOW_STAR` rule does.
pub fn parse_cron(expr: &str) -> Result<croner::Cron, CronError> {
    let e = expr.trim();
    let expanded = match e.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        n if n.starts_with('@') => return Err(CronError::Nickname),
        _ => e,
    };
    let fields: Vec<&str> = expanded.split_whitespace().collect();
    if !(5..=6).contains(&fields.len()) {
        return Err(CronError::Fields(fields.len()));
    }
    if let Some(why) = crate::cron_fields::out_of_range(&fields) {
        return Err(CronError::Invalid(why));
    }
    let (dom, dow) = (fields[fields.len() - 3], fields[fields.len() - 1]);
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Optional)
        .dom_and_dow(dom.starts_with('*') || dow.starts_with('*'))
        .build()
        .parse(expanded)
        .map_err(|e| CronError::Invalid(e.to_string()))
}

/// [`parse_cron`] for a schedule as written: six fields only with `seconds: true`, and
/// `seconds: true` only with six.
pub fn parse_schedule_cron(expr: &str, seconds: bool) -> Result<croner::Cron, CronError> {
    let cron = parse_cron(expr)?;
    let six = expr.split_whitespace().count() == 6;
    match (six, seconds) {
        (true, false) => Err(CronError::Seconds {
            cadence: crate::cron_fields::cadence(&cron),
        }),
        (false, true) => Err(CronError::Invalid(
            "`seconds: true` needs six fields, seconds first (`*/5 * * * * *`)".into(),
        )),
        _ => Ok(cron),
    }
}

/// A schedule whose cron expression does not parse, with the expression.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{cron}` {source}")]
pub struct ScheduleError {
    pub cron: String,
    pub source: CronError,
}

impl Ticker {
    pub fn new(s: &Schedule) -> Result<Ticker, ScheduleError> {
        let cron = parse_cron(&s.cron).map_err(|source| ScheduleError {
            cron: s.cron.clone(),
            source,
        })?;
        Ok(Ticker {
            cron,
            timezone: s.timezone,
            every_hour: hour_is_interval(&s.cron),
        })
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.between(t, DateTime::<Utc>::MAX_UTC, 1)
            .into_iter()
            .next()
    }

    /// The wall-clock time `t` shows in the schedule's zone.
    fn wall(&self, t: DateTime<Utc>) -> NaiveDateTime {
        t.with_timezone(&self.timezone).naive_local()
    }

    /// The instants a matching wall-clock time names (see [`Ticker`]).
    fn instants(&self, w: NaiveDateTime) -> Vec<DateTime<Utc>> {
        use chrono::offset::LocalResult;
        use chrono::{TimeZone, Timelike};
        let utc = |t: DateTime<chrono_tz::Tz>| t.with_timezone(&Utc);
        match self.timezone.from_local_datetime(&w) {
            LocalResult::Single(t) => vec![utc(t)],
            LocalResult::Ambiguous(first, second) if self.every_hour => {
                vec![utc(first), utc(second)]
            }
            LocalResult::Ambiguous(first, _) => vec![utc(first)],
            // Skipped: the gap ends on a whole minute, at most a few hours on.
            LocalResult::None => {
                let mut m = w
                    .with_second(0)
                    .unwrap_or(w)
                    .with_nanosecond(0)
                    .unwrap_or(w);
                for _ in 0..24 * 60 {
                    m += Duration::minutes(1);
                    if let Some(t) = self.timezone.from_local_datetime(&m).earliest() {
                        return vec![utc(t)];
                    }
                }
                Vec::new()
            }
        }
    }

    /// The ticks in (`after`, `until`], oldest first, at most `limit` of the newest (of
    /// the oldest when `until` is unbounded).
    pub fn between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        limit: usize,
    ) -> Vec<DateTime<Utc>> {
        let unbounded = until == DateTime::<Utc>::MAX_UTC;
        // Wall-clock times from before `after` can name instants after it only across a
        // fall back (the second pass of the repeated hour), and by at most the drop; so
        // the walk starts that much earlier there, and nowhere else.
        // croner also keeps the sub-second part of where it starts in every occurrence
        // it yields (after 12:59:59.884 comes 13:00:00.884): ticks are whole seconds, so
        // it starts from a whole second (no tick lies between it and `after`).
        let start = (self.wall(after) - self.fall_back_near(after)).trunc_subsecs(0);
        // Likewise, wall-clock times past `until`'s can name instants before it.
        let horizon = (!unbounded)
            .then(|| {
                self.wall(until)
                    .checked_add_signed(self.fall_back_near(until))
            })
            .flatten();
        let mut out: Vec<DateTime<Utc>> = Vec::new();
        // For an unbounded walk: past this wall-clock time no later match names an
        // instant before the ticks already found.
        let mut enough: Option<NaiveDateTime> = None;
        for w in self.cron.iter_after(start.and_utc()) {
            let w = w.naive_utc();
            if horizon.is_some_and(|h| w > h) || enough.is_some_and(|e| w > e) {
                break;
            }
            for t in self.instants(w) {
                if t > after && t <= until {
                    out.push(t);
                }
            }
            if unbounded && out.len() >= limit && enough.is_none() {
                enough = Some(w + self.fall_back_near(*out.iter().max().expect("limit ticks")));
            }
            // A long bounded window keeps only its newest ticks (an unbounded walk stops
            // at `enough`, soon after `limit`).
            if !unbounded && out.len() > 2 * limit + 16 {
                out.sort();
                out.dedup();
                let drop = out.len().saturating_sub(limit + 8);
                out.drain(..drop);
            }
        }
        out.sort();
        out.dedup();
        if unbounded {
            out.truncate(limit);
        } else {
            let drop = out.len().saturating_sub(limit);
            out.drain(..drop);
        }
        out
    }

    /// How far past `t` croner can still yield an instant at or before `t`: it walks local
    /// wall-clock time, so only a fall-back near `t` (the offset dropping) puts instants
    /// out of UTC order, and by at most the drop. Zero elsewhere, so deciding a tick reads
    /// one occurrence past it instead of hours of them (a `* * * * *` schedule walked 180
    /// minutes per walk before; croner was about a fifth of the server's profile at a
    /// minute boundary).
    fn fall_back_near(&self, t: DateTime<Utc>) -> Duration {
        use chrono::{Offset, TimeZone};
        let window = Duration::hours(3);
        let offset = |t: DateTime<Utc>| {
            self.timezone
                .offset_from_utc_datetime(&t.naive_utc())
                .fix()
                .local_minus_utc()
        };
        match (t.checked_sub_signed(window), t.checked_add_signed(window)) {
            (Some(before), Some(after)) => {
                Duration::seconds(i64::from((offset(before) - offset(after)).max(0)))
            }
            _ => window,
        }
    }
}

/// The id of a tick.
pub fn tick_id(pipeline: &str, at: DateTime<Utc>) -> String {
    format!(
        "{pipeline}@{}",
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

/// The run id a tick's run gets: deterministic, so a restart starts the same run.
pub fn tick_run_id(pipeline: &str, at: DateTime<Utc>) -> RunId {
    // 48 bits of the tick's id: a thousand schedules firing in the same second must not
    // share a run id (16 bits collided about every minute at that scale).
    let h = crate::cache::digest(tick_id(pipeline, at).as_bytes());
    RunId(format!("{}-{}", at.format("%Y%m%d-%H%M%S"), &h[7..19]))
}

/// What to do about one tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start run `run` for the tick at `at`.
    Fire {
        at: DateTime<Utc>,
        run: RunId,
        replace: Vec<RunId>,
    },
    /// Recorded, not run.
    Skip { at: DateTime<Utc>, reason: String },
}

/// One schedule for [`due_all`] to decide.
#[derive(Debug)]
pub struct Due<'a> {
    pub pipeline: &'a str,
    pub schedule: &'a Schedule,
    pub ticker: &'a Ticker,
}

/// Makes the record of a fired tick's run (pipeline, scheduled time, run id), or says why
/// it cannot start.
pub type MakeRun<'a> =
    dyn FnMut(&str, DateTime<Utc>, &RunId) -> Result<Option<RunRecord>, String> + 'a;

/// A tick [`due_all`] decided (and claimed) for one of its schedules.
#[derive(Debug)]
pub struct Decided {
    pub pipeline: String,
    pub decision: Decision,
    /// For a fired tick, its run as recorded in the state store with the claim.
    pub record: Option<RunRecord>,
}

/// Decides the ticks of `pipeline` due at `now` and claims them in `state`: each returned
/// [`Decision::Fire`] is recorded (with its run id, the run itself left to the caller)
/// and no other caller will get it. Ticks claimed earlier whose run was never created
/// are returned again, to start.
pub fn due(
    state: &dyn StateStore,
    pipeline: &str,
    schedule: &Schedule,
    ticker: &Ticker,
    now: DateTime<Utc>,
) -> Result<Vec<Decision>, StateError> {
    let one = Due {
        pipeline,
        schedule,
        ticker,
    };
    Ok(due_all(state, &[one], now, "", &mut |_, _, _| Ok(None))?
        .into_iter()
        .map(|d| d.decision)
        .collect())
}

/// Decides the due ticks of many schedules at once, in a fixed number of reads and one
/// write transaction however many there are (a thousand schedules falling due in the
/// same second are claimed and recorded within milliseconds of it):
///
/// - fired ticks recorded since `unstarted_since` whose run does not exist are returned
///   to start, their run recorded now (what `schedule trigger` queues, or a claim whose
///   engine died before its run existed);
/// - every other due tick is decided by the schedule's policy and claimed, and each
///   fired one's run, as `record` makes it (`None`: the caller records it), is recorded
///   in the same transaction as the claim. A tick someone else claimed first is left
///   out; a fired tick whose run cannot be made or recorded is recorded as skipped, with
///   why.
pub fn due_all(
    state: &dyn StateStore,
    schedules: &[Due<'_>],
    now: DateTime<Utc>,
    unstarted_since: &str,
    record: &mut MakeRun<'_>,
) -> Result<Vec<Decided>, StateError> {
    let wanted: std::collections::BTreeMap<&str, &Due<'_>> =
        schedules.iter().map(|d| (d.pipeline, d)).collect();
    let mut out = Vec::new();
    for t in state.unstarted_ticks_since(unstarted_since)? {
        let (true, Some(run), Ok(at)) = (
            wanted.contains_key(t.pipeline.as_str()),
            t.run_id,
            DateTime::parse_from_rfc3339(&t.scheduled_time),
        ) else {
            continue; // another server's pipeline, or not a tick of ours
        };
        let (at, run) = (at.with_timezone(&Utc), RunId(run));
        let Ok(rec) = record(&t.pipeline, at, &run) else {
            continue; // asked again next time
        };
        if let Some(rec) = &rec {
            if state.create_run(rec).is_err() {
                continue; // another replica started it first
            }
        }
        out.push(Decided {
            pipeline: t.pipeline,
            decision: Decision::Fire {
                at,
                run,
                replace: Vec::new(),
            },
            record: rec,
        });
    }
    let mut batch: Vec<(TickRecord, Option<RunRecord>)> = Vec::new();
    let mut decided: Vec<(String, Decision)> = Vec::new();
    for (entry, last) in state.schedules_with_last_tick()? {
        let Some(due) = wanted.get(entry.pipeline.as_str()) else {
            continue;
        };
        if entry.suspended || due.schedule.suspend {
            continue;
        }
        let last = last
            .and_then(|l| DateTime::parse_from_rfc3339(&l).ok())
            .map(|d| d.with_timezone(&Utc));
        for (tick, decision) in decide(state, due, &entry.anchor, last, now)? {
            let made = match &decision {
                Decision::Fire { at, run, .. } => record(due.pipeline, *at, run),
                Decision::Skip { .. } => Ok(None),
            };
            let (tick, decision, rec) = match (made, decision) {
                (Ok(rec), decision) => (tick, decision, rec),
                (Err(why), Decision::Fire { at, .. } | Decision::Skip { at, .. }) => {
                    let reason = format!("cannot start: {why}");
                    (skipped(tick, &reason), Decision::Skip { at, reason }, None)
                }
            };
            batch.push((tick, rec));
            decided.push((entry.pipeline.clone(), decision));
        }
    }
    if batch.is_empty() {
        return Ok(out);
    }
    let claims = state.claim_ticks(&batch)?;
    for (((tick, rec), (pipeline, decision)), claim) in batch.into_iter().zip(decided).zip(claims) {
        match claim {
            Ok(true) => out.push(Decided {
                pipeline,
                decision,
                record: rec,
            }),
            Ok(false) => {} // someone else decided this tick
            Err(e) => {
                let (Decision::Fire { at, .. } | Decision::Skip { at, .. }) = decision;
                let reason = format!("cannot be recorded: {e}");
                if state.claim_tick(&skipped(tick, &reason))? {
                    out.push(Decided {
                        pipeline,
                        decision: Decision::Skip { at, reason },
                        record: None,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// `tick` recorded as skipped, for `reason`.
fn skipped(tick: TickRecord, reason: &str) -> TickRecord {
    TickRecord {
        outcome: "skipped".into(),
        run_id: None,
        reason: Some(reason.to_owned()),
        ..tick
    }
}

/// The ticks of one schedule due at `now` after its anchor and its newest tick `last`,
/// each with the record that claims it, oldest first. The runs in flight are read only
/// when a tick would fire under `forbid` or `replace`.
fn decide(
    state: &dyn StateStore,
    due: &Due<'_>,
    anchor: &str,
    last: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> Result<Vec<(TickRecord, Decision)>, StateError> {
    let (pipeline, schedule, ticker) = (due.pipeline, due.schedule, due.ticker);
    let anchor = DateTime::parse_from_rfc3339(anchor)
        .map(|d| d.with_timezone(&Utc))
        .unwrap_or(now);
    let after = last.map_or(anchor, |l| l.max(anchor));
    let limit = match schedule.catchup {
        Catchup::All => schedule.max_catchup as usize + 1,
        _ => 1,
    };
    // Every tick since `after` is decided: the newest `limit` are candidates, and the ones
    // before them are recorded as skipped without listing years of them.
    let candidates = ticker.between(after, now, limit);
    let Some(&newest) = candidates.last() else {
        return Ok(Vec::new());
    };
    let first_candidate = candidates[0];
    // Older missed ticks are recorded as skipped too (the newest thousand of them).
    let dropped = ticker.between(after, first_candidate - Duration::seconds(1), 1000);
    let mut decisions: Vec<(DateTime<Utc>, Option<String>)> = dropped
        .into_iter()
        .map(|d| {
            let why = format!(
                "missed; beyond catchup `{}`",
                catchup_name(schedule.catchup)
            );
            (d, Some(why))
        })
        .collect();
    let on_time = now - newest <= ON_TIME;
    for &at in &candidates {
        let fire = match schedule.catchup {
            Catchup::None => at == newest && on_time,
            Catchup::Latest => at == newest,
            Catchup::All => true,
        };
        let reason =
            (!fire).then(|| format!("missed; catchup `{}`", catchup_name(schedule.catchup)));
        decisions.push((at, reason));
    }
    let mut in_flight: Option<Vec<RunId>> = None;
    let mut out = Vec::new();
    for (at, reason) in decisions {
        let mut reason = reason;
        let mut replace = Vec::new();
        if reason.is_none() && schedule.concurrency != Concurrency::Allow {
            let running = match &in_flight {
                Some(r) => r,
                None => in_flight.insert(state.running_runs(pipeline)?),
            };
            match (schedule.concurrency, running.first()) {
                (Concurrency::Forbid, Some(first)) => {
                    reason = Some(format!(
                        "run {first} is still running (concurrency: forbid)"
                    ))
                }
                (Concurrency::Replace, _) => replace = running.clone(),
                _ => {}
            }
        }
        let run = tick_run_id(pipeline, at);
        let record = TickRecord {
            id: tick_id(pipeline, at),
            pipeline: pipeline.to_owned(),
            scheduled_time: at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            outcome: if reason.is_some() {
                "skipped".into()
            } else {
                "fired".into()
            },
            run_id: reason.is_none().then(|| run.0.clone()),
            reason: reason.clone(),
        };
        out.push((
            record,
            match reason {
                None => Decision::Fire { at, run, replace },
                Some(reason) => Decision::Skip { at, reason },
            },
        ));
    }
    Ok(out)
}

fn catchup_name(c: Catchup) -> &'static str {
    match c {
        Catchup::None => "none",
        Catchup::Latest => "latest",
        Catchup::All => "all",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{prelude::*, SqliteState};

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn schedule(cron: &str, tz: &str, catchup: Catchup, concurrency: Concurrency) -> Schedule {
        Schedule {
            cron: cron.into(),
            timezone: tz.parse().unwrap(),
            concurrency,
            catchup,
            max_catchup: 3,
            suspend: false,
        }
    }

    fn ticks(s: &Schedule, from: &str, to: &str) -> Vec<String> {
        Ticker::new(s)
            .unwrap()
            .between(at(from), at(to), 100)
            .iter()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .collect()
    }

    #[test]
    fn ticks_fall_on_whole_seconds_whenever_asked() {
        let s = schedule("* * * * *", "UTC", Catchup::None, Concurrency::Allow);
        let t = Ticker::new(&s).unwrap();
        // The scheduler sleeps until the next tick: it must be 13:00:00, not 13:00:00.884.
        assert_eq!(
            t.next_after(at("2026-11-22T12:59:59.884Z")),
            Some(at("2026-11-22T13:00:00Z"))
        );
        assert_eq!(
            t.between(
                at("2026-11-22T12:58:30.5Z"),
                at("2026-11-22T13:00:00.25Z"),
                10
            ),
            [at("2026-11-22T12:59:00Z"), at("2026-11-22T13:00:00Z")]
        );
    }

    #[test]
    fn deciding_inside_the_first_pass_of_a_repeated_hour_keeps_the_second() {
        // Regression: deciding at 00:30Z (02:30 CEST, first pass) went on to 02:00Z, and
        // 01:00Z and 01:30Z (02:00 and 02:30 CET) never fired.
        let berlin = schedule(
            "*/30 * * * *",
            "Europe/Berlin",
            Catchup::All,
            Concurrency::Allow,
        );
        let t = Ticker::new(&berlin).unwrap();
        assert_eq!(
            t.next_after(at("2026-10-25T00:30:00Z")),
            Some(at("2026-10-25T01:00:00Z"))
        );
        assert_eq!(
            t.next_after(at("2026-10-25T01:00:00Z")),
            Some(at("2026-10-25T01:30:00Z"))
        );
        let la = schedule(
            "0 * * * *",
            "America/Los_Angeles",
            Catchup::All,
            Concurrency::Allow,
        );
        let t = Ticker::new(&la).unwrap();
        assert_eq!(
            t.next_after(at("2026-11-01T08:00:00Z")),
            Some(at("2026-11-01T09:00:00Z"))
        );
    }

    #[test]
    fn daylight_saving_in_two_timezones() {
        // Berlin springs forward at 02:00 → 03:00 on 2026-03-29: 02:30 does not exist and
        // fires once at 03:00 local (01:00Z); falls back on 2026-10-25: 02:30 exists twice
        // and fires once.
        let berlin = schedule(
            "30 2 * * *",
            "Europe/Berlin",
            Catchup::All,
            Concurrency::Allow,
        );
        assert_eq!(
            ticks(&berlin, "2026-03-27T12:00:00Z", "2026-03-31T00:00:00Z"),
            [
                "2026-03-28T01:30:00Z",
                "2026-03-29T01:00:00Z",
                "2026-03-30T00:30:00Z"
            ]
        );
        assert_eq!(
            ticks(&berlin, "2026-10-24T12:00:00Z", "2026-10-27T00:00:00Z"),
            ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
        );
        // Los Angeles: a job every 30 minutes keeps firing every 30 real minutes through
        // the fall-back hour (both 01:00 and both 01:30 happen).
        let la = schedule(
            "0,30 * * * *",
            "America/Los_Angeles",
            Catchup::All,
            Concurrency::Allow,
        );
        let fall = ticks(&la, "2026-11-01T07:45:00Z", "2026-11-01T10:15:00Z");
        assert_eq!(
            fall,
            [
                "2026-11-01T08:00:00Z",
                "2026-11-01T08:30:00Z",
                "2026-11-01T09:00:00Z",
                "2026-11-01T09:30:00Z",
                "2026-11-01T10:00:00Z"
            ]
        );
        // Deciding in the first pass through the repeated hour: croner yields 01:00 PDT,
        // 01:00 PST, then 01:30 PDT, so the walk must go on past `until` to find 01:30 PDT.
        assert_eq!(
            ticks(&la, "2026-11-01T07:45:00Z", "2026-11-01T08:40:00Z"),
            ["2026-11-01T08:00:00Z", "2026-11-01T08:30:00Z"]
        );
        // Spring forward on 2026-03-08: 02:00–03:00 does not exist; 09:00Z is 01:00 PST,
        // the next tick is 03:00 PDT = 10:00Z.
        let daily = schedule(
            "0 2 * * *",
            "America/Los_Angeles",
            Catchup::All,
            Concurrency::Allow,
        );
        assert_eq!(
            ticks(&daily, "2026-03-07T00:00:00Z", "2026-03-09T12:00:00Z"),
            [
                "2026-03-07T10:00:00Z",
                "2026-03-08T10:00:00Z",
                "2026-03-09T09:00:00Z"
            ]
        );
    }

    /// Starts (records) the runs of the fired ticks, as `serve` does right after deciding.
    fn start(state: &SqliteState, ds: &[Decision]) {
        for d in ds {
            if let Decision::Fire { run, .. } = d {
                let mut rec = crate::state::conformance::run_record(&run.0);
                rec.pipeline = "p".into();
                state.create_run(&rec).unwrap();
                state
                    .finish_run(run, crate::state::Phase::Succeeded, None)
                    .unwrap();
            }
        }
    }

    fn fired(ds: &[Decision]) -> Vec<String> {
        ds.iter()
            .filter_map(|d| match d {
                Decision::Fire { at, .. } => Some(at.format("%H:%M").to_string()),
                _ => None,
            })
            .collect()
    }

    fn fresh(registered: &str) -> SqliteState {
        let state = SqliteState::in_memory().unwrap();
        state.upsert_schedule("p", "p.yaml", registered).unwrap();
        state
    }

    #[test]
    fn missed_ticks_across_a_restart_follow_the_catchup_policy() {
        for (catchup, expect) in [
            (Catchup::None, vec![]),
            (Catchup::Latest, vec!["05:00"]),
            (Catchup::All, vec!["02:00", "03:00", "04:00", "05:00"]),
        ] {
            let s = schedule("0 * * * *", "UTC", catchup, Concurrency::Allow);
            let t = Ticker::new(&s).unwrap();
            let state = fresh("2026-06-01T00:30:00Z");
            // Up at 01:00:05: the 01:00 tick fires on time, once, however often asked.
            let d = due(&state, "p", &s, &t, at("2026-06-01T01:00:05Z")).unwrap();
            assert_eq!(fired(&d), ["01:00"], "{catchup:?}");
            start(&state, &d);
            assert!(due(&state, "p", &s, &t, at("2026-06-01T01:00:30Z"))
                .unwrap()
                .is_empty());
            // Down from 01:10 to 05:20: four ticks missed; `all` with max_catchup 3 runs
            // the newest three missed ones and the newest.
            let d = due(&state, "p", &s, &t, at("2026-06-01T05:20:00Z")).unwrap();
            assert_eq!(fired(&d), expect, "{catchup:?}");
            start(&state, &d);
            // Every tick is recorded once, fired or skipped: nothing lost, nothing twice.
            let recorded: Vec<String> = state
                .ticks("p", 100)
                .unwrap()
                .iter()
                .map(|t| t.scheduled_time.clone())
                .collect();
            assert_eq!(recorded.len(), 5, "{catchup:?}: {recorded:?}");
            assert!(due(&state, "p", &s, &t, at("2026-06-01T05:20:00Z"))
                .unwrap()
                .is_empty());
        }
        // `none` fires an on-time tick after downtime, and drops the older ones.
        let s = schedule("0 * * * *", "UTC", Catchup::None, Concurrency::Allow);
        let t = Ticker::new(&s).unwrap();
        let state = fresh("2026-06-01T00:30:00Z");
        let d = due(&state, "p", &s, &t, at("2026-06-01T05:00:10Z")).unwrap();
        assert_eq!(fired(&d), ["05:00"]);
    }

    #[test]
    fn a_claimed_tick_whose_run_never_started_is_started_after_a_restart() {
        let s = schedule("0 * * * *", "UTC", Catchup::Latest, Concurrency::Allow);
        let t = Ticker::new(&s).unwrap();
        let state = fresh("2026-06-01T00:30:00Z");
        let first = due(&state, "p", &s, &t, at("2026-06-01T01:00:01Z")).unwrap();
        // The engine died here, before creating the run: the next look starts it.
        let again = due(&state, "p", &s, &t, at("2026-06-01T01:00:20Z")).unwrap();
        assert_eq!(first, again);
        let Decision::Fire { run, .. } = &first[0] else {
            panic!()
        };
        assert_eq!(run, &tick_run_id("p", at("2026-06-01T01:00:00Z")));
        let ids: std::collections::BTreeSet<RunId> = (0..10_000)
            .map(|i| tick_run_id(&format!("s{i:05}"), at("2026-06-01T01:00:00Z")))
            .collect();
        assert_eq!(
            ids.len(),
            10_000,
            "ten thousand schedules in one second, ten thousand ids"
        );
        let mut rec = crate::state::conformance::run_record(&run.0);
        rec.pipeline = "p".into();
        state.create_run(&rec).unwrap();
        assert!(due(&state, "p", &s, &t, at("2026-06-01T01:00:30Z"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn forbid_skips_and_replace_cancels_while_a_run_is_in_flight() {
        for (concurrency, fire) in [(Concurrency::Forbid, false), (Concurrency::Replace, true)] {
            let s = schedule("0 * * * *", "UTC", Catchup::Latest, concurrency);
            let t = Ticker::new(&s).unwrap();
            let state = fresh("2026-06-01T00:30:00Z");
            let mut long = crate::state::conformance::run_record("long-run");
            long.pipeline = "p".into();
            state.create_run(&long).unwrap();
            let d = due(&state, "p", &s, &t, at("2026-06-01T01:00:01Z")).unwrap();
            match (&d[0], fire) {
                (Decision::Fire { replace, .. }, true) => {
                    assert_eq!(replace, &[RunId("long-run".into())])
                }
                (Decision::Skip { reason, .. }, false) => {
                    assert!(reason.contains("long-run is still running"), "{reason}")
                }
                other => panic!("{concurrency:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn suspended_schedules_fire_nothing_and_resuming_skips_the_backlog() {
        let s = schedule("0 * * * *", "UTC", Catchup::All, Concurrency::Allow);
        let t = Ticker::new(&s).unwrap();
        let state = fresh("2026-06-01T00:30:00Z");
        state.set_suspended("p", true, None).unwrap();
        assert!(due(&state, "p", &s, &t, at("2026-06-01T03:00:05Z"))
            .unwrap()
            .is_empty());
        // Resumed at 03:30: the 01:00–03:00 backlog does not fire; 04:00 does.
        state
            .set_suspended("p", false, Some("2026-06-01T03:30:00Z"))
            .unwrap();
        assert!(due(&state, "p", &s, &t, at("2026-06-01T03:31:00Z"))
            .unwrap()
            .is_empty());
        let d = due(&state, "p", &s, &t, at("2026-06-01T04:00:02Z")).unwrap();
        assert_eq!(fired(&d), ["04:00"]);
        // Resuming *with* the backlog keeps the old anchor: `all` catches up.
        start(&state, &d);
        state.set_suspended("p", true, None).unwrap();
        state.set_suspended("p", false, None).unwrap();
        let d = due(&state, "p", &s, &t, at("2026-06-01T07:00:01Z")).unwrap();
        assert_eq!(fired(&d), ["05:00", "06:00", "07:00"]);
    }
}

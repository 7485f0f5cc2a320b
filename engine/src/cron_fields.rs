//! What a cron expression's fields say, before croner reads them: each number within its
//! field's range (`hour 25 is out of 0–23`), and what six fields, seconds first, would fire
//! at, said in words (`0 3 * * * *`, a nightly with a stray `*`, is hourly).

/// A field's name and the numbers it may hold.
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
}

const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
};
const FIVE: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
    },
    // 7 is Sunday too, as in cronie.
    Field {
        name: "day of week",
        min: 0,
        max: 7,
    },
];

/// The first number of `fields` (5, or 6 with seconds first) out of its field's range,
/// said with the field's name. Names (`MON`, `JAN`), `*`, `?`, `L` and `#` are croner's to
/// judge.
pub fn out_of_range(fields: &[&str]) -> Option<String> {
    let names: Vec<&Field> = match fields.len() {
        6 => std::iter::once(&SECOND).chain(FIVE.iter()).collect(),
        _ => FIVE.iter().collect(),
    };
    for (text, field) in fields.iter().zip(names) {
        for part in text.split(',') {
            let (range, step) = part.split_once('/').unwrap_or((part, ""));
            if let Ok(0) = step.parse::<u32>() {
                return Some(format!("{} step 0 never advances", field.name));
            }
            for n in range.split('-').filter_map(|n| n.parse::<u32>().ok()) {
                if n < field.min || n > field.max {
                    return Some(format!(
                        "{} {n} is out of {}–{}",
                        field.name, field.min, field.max
                    ));
                }
            }
        }
    }
    None
}

/// How often `cron` fires, in words, from its first ticks after a Monday midnight:
/// `every 5 seconds`, `every hour`, or the first ticks themselves.
pub fn cadence(cron: &croner::Cron) -> String {
    use chrono::TimeZone as _;
    let start = chrono::Utc
        .with_ymd_and_hms(2026, 1, 5, 0, 0, 0)
        .single()
        .expect("a valid instant");
    let ticks: Vec<chrono::DateTime<chrono::Utc>> = cron.iter_after(start).take(4).collect();
    let gaps: Vec<i64> = ticks
        .windows(2)
        .map(|w| (w[1] - w[0]).num_seconds())
        .collect();
    let every = |n: i64, unit: &str| match n {
        1 => format!("every {unit}"),
        n => format!("every {n} {unit}s"),
    };
    match gaps.as_slice() {
        [g, rest @ ..] if rest.iter().all(|r| r == g) => match *g {
            g if g % 86_400 == 0 => every(g / 86_400, "day"),
            g if g % 3_600 == 0 => every(g / 3_600, "hour"),
            g if g % 60 == 0 => every(g / 60, "minute"),
            g => every(g, "second"),
        },
        _ => format!(
            "at {}",
            ticks
                .iter()
                .map(|t| t.format("%H:%M:%S").to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_named_and_cadences_said() {
        let f = |e: &str| out_of_range(&e.split_whitespace().collect::<Vec<_>>());
        assert_eq!(f("0 25 * * *").unwrap(), "hour 25 is out of 0–23");
        assert_eq!(f("0 3 32 * *").unwrap(), "day of month 32 is out of 1–31");
        assert_eq!(f("61 0 3 * * *").unwrap(), "second 61 is out of 0–59");
        assert_eq!(f("*/0 * * * *").unwrap(), "minute step 0 never advances");
        assert_eq!(f("0-59/5 1,2,23 * JAN-DEC MON"), None);
        let said = |e: &str| cadence(&crate::schedule::parse_cron(e).unwrap());
        assert_eq!(said("0 3 * * * *"), "every hour");
        assert_eq!(said("*/5 * * * * *"), "every 5 seconds");
        assert_eq!(said("0 3 * * *"), "every day");
        assert_eq!(said("* * * * *"), "every minute");
    }
}

//! One channel message's fields as read, each on its own: a field of the wrong type (a
//! string where a number belongs, an array, a Python `NaN`) is null in the frame and
//! counted, never the end of the message, and never the end of the drive.
//!
//! serde reads every field the frame table knows into a [`Raw`] (whatever its JSON type)
//! and skips the rest without building them; the frame builder then takes each as the
//! type its column has ([`Raw::num`], [`Raw::text`], [`Raw::flag`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// One field as the message had it.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) enum Raw {
    /// Not in the message.
    #[default]
    Absent,
    Null,
    Num(f64),
    Text(Arc<str>),
    Flag(bool),
    /// An array or an object.
    Nested,
}

/// What a field gives its column.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Taken<T> {
    /// Absent or null: the column is null.
    Missing,
    Value(T),
    /// Of another type than the column's: null, and counted.
    Invalid,
}

impl<T> Taken<T> {
    pub(super) fn value(self) -> Option<T> {
        match self {
            Taken::Value(v) => Some(v),
            _ => None,
        }
    }
}

impl Raw {
    /// A field of an already parsed JSON object (`None`: absent).
    pub(super) fn of(v: Option<&serde_json::Value>) -> Raw {
        use serde_json::Value;
        match v {
            None => Raw::Absent,
            Some(Value::Null) => Raw::Null,
            Some(Value::Number(n)) => Raw::Num(n.as_f64().unwrap_or(f64::NAN)),
            Some(Value::String(s)) => Raw::Text(Arc::from(s.as_str())),
            Some(Value::Bool(b)) => Raw::Flag(*b),
            Some(_) => Raw::Nested,
        }
    }

    /// A decoded field.
    pub(super) fn of_dyn(v: &crate::decode::Dyn) -> Raw {
        use crate::decode::Dyn;
        match v {
            Dyn::Null => Raw::Null,
            Dyn::Bool(b) => Raw::Flag(*b),
            Dyn::Int(n) => Raw::Num(*n as f64),
            Dyn::Uint(n) => Raw::Num(*n as f64),
            Dyn::Float(f) => Raw::Num(*f),
            Dyn::Text(s) => Raw::Text(s.clone()),
            Dyn::Bytes(_) | Dyn::List(_) | Dyn::Map(_) => Raw::Nested,
        }
    }

    fn take<T>(&self, pick: impl FnOnce(&Raw) -> Option<T>) -> Taken<T> {
        match self {
            Raw::Absent | Raw::Null => Taken::Missing,
            other => pick(other).map_or(Taken::Invalid, Taken::Value),
        }
    }

    /// A number column's value (a finite JSON number).
    pub(super) fn num(&self) -> Taken<f64> {
        self.take(|r| match r {
            Raw::Num(n) if n.is_finite() => Some(*n),
            _ => None,
        })
    }

    /// A string column's value.
    pub(super) fn text(&self) -> Taken<Arc<str>> {
        self.take(|r| match r {
            Raw::Text(s) => Some(s.clone()),
            _ => None,
        })
    }

    /// A boolean column's value.
    pub(super) fn flag(&self) -> Taken<bool> {
        self.take(|r| match r {
            Raw::Flag(b) => Some(*b),
            _ => None,
        })
    }
}

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> Visitor<'de> for RawVisitor {
    type Value = Raw;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw, E> {
        Ok(Raw::Num(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw, E> {
        Ok(Raw::Num(v as f64))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Raw, E> {
        Ok(Raw::Num(v as f64))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw, E> {
        Ok(Raw::Flag(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw, E> {
        Ok(Raw::Text(Arc::from(v)))
    }
    fn visit_unit<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw, E> {
        Ok(Raw::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Raw, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Raw::Nested)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Raw::Nested)
    }
}

/// The fields of one channel message the frame table reads: every channel's, in one
/// struct (serde skips the rest without building them).
#[derive(Default, serde::Deserialize)]
#[serde(default)]
pub(super) struct Msg {
    pub speed_mps: Raw,
    pub accel_x: Raw,
    pub accel_y: Raw,
    pub yaw_rate: Raw,
    pub steering: Raw,
    pub brake_pressure: Raw,
    pub lat: Raw,
    pub lon: Raw,
    pub lateral_offset_m: Raw,
    pub lane_confidence: Raw,
    pub object_distance_m: Raw,
    pub object_rel_speed_mps: Raw,
    pub distance_m: Raw,
    pub rel_speed_mps: Raw,
    pub class: Raw,
    pub weather: Raw,
    pub time_of_day: Raw,
    pub hard_brake: Raw,
    pub cut_in: Raw,
    pub pedestrian_close_call: Raw,
    pub low_lane_confidence: Raw,
}

impl Msg {
    /// Parses one message's bytes. Python's `json` writes `NaN`, `Infinity` and
    /// `-Infinity` as bare words, which JSON has not: such a message is read again with
    /// them as strings, so only their fields are invalid. Not a JSON object at all (an
    /// array, text): `None`.
    pub(super) fn parse(data: &[u8]) -> Option<Msg> {
        // serde would also read a struct out of an array, by position.
        if data.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        serde_json::from_slice::<Msg>(data).ok().or_else(|| {
            let fixed = crate::decode::quote_non_finite(data)?;
            serde_json::from_slice::<Msg>(&fixed).ok()
        })
    }
}

/// What one drive's messages held that the table could not: fields of another type
/// (`/vehicle.speed_mps` → count) and whole messages that were not JSON objects (topic →
/// count).
#[derive(Debug, Default, Clone)]
pub(super) struct Invalid {
    pub fields: BTreeMap<String, u64>,
    pub messages: BTreeMap<String, u64>,
}

impl Invalid {
    pub(super) fn field(&mut self, topic: &str, field: &str) {
        *self.fields.entry(format!("{topic}.{field}")).or_default() += 1;
    }

    pub(super) fn message(&mut self, topic: &str) {
        *self.messages.entry(topic.to_owned()).or_default() += 1;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.messages.is_empty()
    }

    pub(super) fn values(&self) -> u64 {
        self.fields.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_field_is_read_on_its_own() {
        let m = Msg::parse(br#"{"speed_mps": "12.5", "accel_x": -6, "class": 3, "steering": null, "lat": [1], "extra": {"a": [1, 2]}}"#).unwrap();
        assert_eq!(m.speed_mps.num(), Taken::Invalid);
        assert_eq!(m.accel_x.num(), Taken::Value(-6.0));
        assert_eq!(m.class.text(), Taken::Invalid);
        assert_eq!(m.steering.num(), Taken::Missing);
        assert_eq!(m.lat.num(), Taken::Invalid);
        assert_eq!(m.lon.num(), Taken::Missing);
    }

    #[test]
    fn python_non_finite_numbers_are_invalid_fields_not_unreadable_messages() {
        let m = Msg::parse(br#"{"speed_mps": NaN, "accel_x": -Infinity, "weather": "NaN \" Infinity", "yaw_rate": 0.5}"#).unwrap();
        assert_eq!(m.speed_mps.num(), Taken::Invalid);
        assert_eq!(m.accel_x.num(), Taken::Invalid);
        assert_eq!(m.weather.text(), Taken::Value(Arc::from("NaN \" Infinity")));
        assert_eq!(m.yaw_rate.num(), Taken::Value(0.5));
        assert!(Msg::parse(b"[1, 2]").is_none());
        assert!(Msg::parse(b"not json").is_none());
    }
}

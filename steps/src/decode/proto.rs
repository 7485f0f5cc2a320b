//! Protobuf messages, from the `FileDescriptorSet` their schema record holds (the MCAP
//! protobuf profile), decoded dynamically by `prost-reflect`.
//!
//! A field a message does not set reads as its default, as every protobuf reader's
//! accessors give it; an enum as its value's name (its number when the schema has none);
//! `bytes` as bytes; a map as a message whose fields are the keys.

use std::sync::Arc;

use prost_reflect::{
    DescriptorPool, DynamicMessage, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};

use super::{Dyn, MAX_DEPTH};

/// The decoder of one channel: its message type.
#[derive(Debug)]
pub struct Proto {
    message: MessageDescriptor,
}

impl Proto {
    pub fn new(name: &str, encoding: &str, schema: &[u8]) -> Result<Proto, String> {
        if !encoding.eq_ignore_ascii_case("protobuf") {
            return Err(format!(
                "a protobuf channel needs a `protobuf` schema, not `{encoding}`"
            ));
        }
        let pool = DescriptorPool::decode(schema)
            .map_err(|e| format!("schema `{name}` is not a readable FileDescriptorSet: {e}"))?;
        let message = pool.get_message_by_name(name).ok_or_else(|| {
            let known: Vec<String> = pool
                .all_messages()
                .take(20)
                .map(|m| m.full_name().to_owned())
                .collect();
            format!(
                "schema `{name}` is not a message of its FileDescriptorSet (it has {})",
                known.join(", ")
            )
        })?;
        Ok(Proto { message })
    }

    pub fn decode(&self, data: &[u8]) -> Result<Dyn, String> {
        let m = DynamicMessage::decode(self.message.clone(), data)
            .map_err(|e| format!("not a {}: {e}", self.message.full_name()))?;
        message(&m, 0)
    }
}

fn message(m: &DynamicMessage, depth: usize) -> Result<Dyn, String> {
    if depth > MAX_DEPTH {
        return Err(format!("nested deeper than {MAX_DEPTH} messages"));
    }
    let mut fields = Vec::new();
    for f in m.descriptor().fields() {
        let v = m.get_field(&f);
        fields.push((Arc::from(f.name()), value(&v, &f.kind(), depth)?));
    }
    Ok(Dyn::Map(fields))
}

fn value(v: &Value, kind: &Kind, depth: usize) -> Result<Dyn, String> {
    Ok(match v {
        Value::Bool(b) => Dyn::Bool(*b),
        Value::I32(n) => Dyn::Int(i64::from(*n)),
        Value::I64(n) => Dyn::Int(*n),
        Value::U32(n) => Dyn::Uint(u64::from(*n)),
        Value::U64(n) => Dyn::Uint(*n),
        Value::F32(f) => Dyn::Float(f64::from(*f)),
        Value::F64(f) => Dyn::Float(*f),
        Value::String(s) => Dyn::Text(Arc::from(s.as_str())),
        Value::Bytes(b) => Dyn::Bytes(Arc::from(&b[..])),
        Value::EnumNumber(n) => match kind {
            Kind::Enum(e) => match e.get_value(*n) {
                Some(named) => Dyn::Text(Arc::from(named.name())),
                None => Dyn::Int(i64::from(*n)),
            },
            _ => Dyn::Int(i64::from(*n)),
        },
        Value::Message(m) => message(m, depth + 1)?,
        Value::List(items) => Dyn::List(
            items
                .iter()
                .map(|i| value(i, kind, depth))
                .collect::<Result<_, _>>()?,
        ),
        Value::Map(entries) => {
            let value_kind = match kind {
                Kind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other.clone(),
            };
            let mut fields: Vec<(Arc<str>, Dyn)> = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let key = match k {
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(n) => n.to_string(),
                    MapKey::I64(n) => n.to_string(),
                    MapKey::U32(n) => n.to_string(),
                    MapKey::U64(n) => n.to_string(),
                    MapKey::String(s) => s.clone(),
                };
                fields.push((Arc::from(key), value(v, &value_kind, depth + 1)?));
            }
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            Dyn::Map(fields)
        }
    })
}

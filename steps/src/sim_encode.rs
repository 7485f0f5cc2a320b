//! How `fleet-sim` writes its messages: JSON (JSON Schema), protobuf (a
//! `FileDescriptorSet` made from the same fields, `drivetrain.sim.Vehicle` …) or ROS 2
//! (`drivetrain_msgs/msg/Vehicle` … as `ros2msg`, CDR little-endian payloads). Every
//! field of every message is always set, so each encoding carries the same values and
//! `ingest` makes the same frames of them.

use prost_reflect::prost::Message as _;
use prost_reflect::prost_types::{
    field_descriptor_proto::{Label, Type},
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, FileDescriptorSet,
};
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor};
use serde_json::Value;

/// The message encodings `fleet-sim` writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SimEncoding {
    #[default]
    Json,
    Protobuf,
    Ros2,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Number,
    Text,
    Flag,
}

/// One channel's schema and how its messages are written.
#[derive(Debug)]
pub struct Channel {
    pub schema_name: String,
    pub schema_encoding: &'static str,
    pub schema: Vec<u8>,
    pub message_encoding: &'static str,
    fields: Vec<(String, Kind)>,
    proto: Option<MessageDescriptor>,
}

/// The fields of a JSON Schema object, in order, with their kinds.
fn fields(json_schema: &str) -> anyhow::Result<Vec<(String, Kind)>> {
    let v: Value = serde_json::from_str(json_schema)?;
    let props = v["properties"]
        .as_object()
        .ok_or_else(|| anyhow::anyhow!("a topic schema without properties"))?;
    props
        .iter()
        .map(|(name, p)| {
            let kind = match p["type"].as_str() {
                Some("number") => Kind::Number,
                Some("string") => Kind::Text,
                Some("boolean") => Kind::Flag,
                other => anyhow::bail!("field {name}: type {other:?}"),
            };
            Ok((name.clone(), kind))
        })
        .collect()
}

impl Channel {
    /// The channel of `topic`, whose JSON Schema is `json_schema` (its `title` names the
    /// protobuf and ROS 2 message types; a JSON schema is named by the topic).
    pub fn new(encoding: SimEncoding, topic: &str, json_schema: &str) -> anyhow::Result<Channel> {
        let title = serde_json::from_str::<Value>(json_schema)?["title"]
            .as_str()
            .unwrap_or("Message")
            .to_owned();
        let fields = fields(json_schema)?;
        let mut c = Channel {
            schema_name: topic.trim_start_matches('/').to_owned(),
            schema_encoding: "jsonschema",
            schema: json_schema.as_bytes().to_vec(),
            message_encoding: "json",
            fields,
            proto: None,
        };
        match encoding {
            SimEncoding::Json => {}
            SimEncoding::Protobuf => {
                let set = descriptor_set(&title, &c.fields);
                let pool = DescriptorPool::from_file_descriptor_set(set.clone())?;
                c.schema_name = format!("drivetrain.sim.{title}");
                c.proto = pool.get_message_by_name(&c.schema_name);
                c.schema = set.encode_to_vec();
                c.schema_encoding = "protobuf";
                c.message_encoding = "protobuf";
            }
            SimEncoding::Ros2 => {
                c.schema_name = format!("drivetrain_msgs/msg/{title}");
                c.schema = c
                    .fields
                    .iter()
                    .map(|(name, kind)| {
                        let ty = match kind {
                            Kind::Number => "float64",
                            Kind::Text => "string",
                            Kind::Flag => "bool",
                        };
                        format!("{ty} {name}\n")
                    })
                    .collect::<String>()
                    .into_bytes();
                c.schema_encoding = "ros2msg";
                c.message_encoding = "cdr";
            }
        }
        Ok(c)
    }

    /// One message (a JSON object with every field of the schema) in the channel's
    /// encoding.
    pub fn encode(&self, m: &Value) -> anyhow::Result<Vec<u8>> {
        if let Some(desc) = &self.proto {
            let mut msg = DynamicMessage::new(desc.clone());
            for (name, kind) in &self.fields {
                let v = &m[name];
                let value = match kind {
                    Kind::Number => prost_reflect::Value::F64(v.as_f64().unwrap_or_default()),
                    Kind::Text => {
                        prost_reflect::Value::String(v.as_str().unwrap_or_default().into())
                    }
                    Kind::Flag => prost_reflect::Value::Bool(v.as_bool().unwrap_or_default()),
                };
                msg.try_set_field_by_name(name, value)?;
            }
            return Ok(msg.encode_to_vec());
        }
        if self.message_encoding == "cdr" {
            return Ok(self.cdr(m));
        }
        Ok(m.to_string().into_bytes())
    }

    /// CDR, little-endian: each primitive aligned to its size from after the 4-byte
    /// encapsulation header.
    fn cdr(&self, m: &Value) -> Vec<u8> {
        let mut out = vec![0, 1, 0, 0];
        let align = |out: &mut Vec<u8>, n: usize| {
            while !(out.len() - 4).is_multiple_of(n) {
                out.push(0);
            }
        };
        for (name, kind) in &self.fields {
            let v = &m[name];
            match kind {
                Kind::Number => {
                    align(&mut out, 8);
                    out.extend(v.as_f64().unwrap_or_default().to_le_bytes());
                }
                Kind::Text => {
                    let s = v.as_str().unwrap_or_default();
                    align(&mut out, 4);
                    out.extend((s.len() as u32 + 1).to_le_bytes());
                    out.extend(s.as_bytes());
                    out.push(0);
                }
                Kind::Flag => out.push(u8::from(v.as_bool().unwrap_or_default())),
            }
        }
        out
    }
}

/// A `FileDescriptorSet` of one proto3 message `drivetrain.sim.TITLE` with `fields`.
fn descriptor_set(title: &str, fields: &[(String, Kind)]) -> FileDescriptorSet {
    let field = |(i, (name, kind)): (usize, &(String, Kind))| FieldDescriptorProto {
        name: Some(name.clone()),
        number: Some(i as i32 + 1),
        label: Some(Label::Optional as i32),
        r#type: Some(match kind {
            Kind::Number => Type::Double,
            Kind::Text => Type::String,
            Kind::Flag => Type::Bool,
        } as i32),
        json_name: Some(name.clone()),
        ..FieldDescriptorProto::default()
    };
    FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some(format!("drivetrain/sim/{}.proto", title.to_lowercase())),
            package: Some("drivetrain.sim".into()),
            syntax: Some("proto3".into()),
            message_type: vec![DescriptorProto {
                name: Some(title.to_owned()),
                field: fields.iter().enumerate().map(field).collect(),
                ..DescriptorProto::default()
            }],
            ..FileDescriptorProto::default()
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Decoder, Dyn};

    const SCHEMA: &str = r#"{"type":"object","title":"Probe","properties":{"speed":{"type":"number"},"class":{"type":"string"},"on":{"type":"boolean"},"zero":{"type":"number"}}}"#;

    #[test]
    fn every_encoding_decodes_to_the_same_message() {
        let m = serde_json::json!({"speed": 12.3456, "class": "truck", "on": true, "zero": 0.0});
        for enc in [SimEncoding::Json, SimEncoding::Protobuf, SimEncoding::Ros2] {
            let c = Channel::new(enc, "/probe", SCHEMA).unwrap();
            let d = Decoder::new(
                c.message_encoding,
                &c.schema_name,
                c.schema_encoding,
                &c.schema,
            )
            .unwrap();
            let got = d.decode(&c.encode(&m).unwrap()).unwrap();
            let field = |n: &str| got.at(&[crate::decode::Seg::Field(n.into())]);
            assert_eq!(field("speed"), Ok(Dyn::Float(12.3456)), "{enc:?}");
            assert_eq!(field("class"), Ok(Dyn::Text("truck".into())), "{enc:?}");
            assert_eq!(field("on"), Ok(Dyn::Bool(true)), "{enc:?}");
            let zero = field("zero").unwrap();
            assert!(
                matches!(zero, Dyn::Float(f) if f == 0.0) || zero == Dyn::Uint(0),
                "{enc:?}: {zero:?}"
            );
        }
    }
}

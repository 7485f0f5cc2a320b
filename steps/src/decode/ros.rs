//! ROS messages from their `.msg` definitions: ROS 2 (`ros2msg` schemas, CDR payloads,
//! either byte order) and ROS 1 (`ros1msg` schemas, ROS 1 serialization).
//!
//! A schema is the root type's definition followed by those it depends on, each after a
//! line of `=` and `MSG: package/Type`, as rosbag2 and the MCAP ROS profiles write them.
//! Field types are the primitives, `string` (bounded `string<=N` too), `time` and
//! `duration` (ROS 1), other messages by `package/Type`, `package/msg/Type` or a bare name
//! of the same package (`Header` is `std_msgs/Header`), and arrays of them (`T[]`,
//! `T[N]`, `T[<=N]`). Constants (`int32 X=1`) and ROS 2 defaults are skipped;
//! `builtin_interfaces/Time` and `Duration` are known without a definition.
//! A `ros2idl` schema (sections after `IDL: package/msg/Type`) is read into the same
//! lines by [`super::idl`].

use std::collections::HashMap;
use std::sync::Arc;

use super::{Dyn, MAX_DEPTH};

/// Which ROS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Ros1,
    Ros2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prim {
    Bool,
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    I64,
    U64,
    F32,
    F64,
    Str,
    /// ROS 1 `time` (`secs`, `nsecs`, both unsigned) and `duration` (both signed).
    Time,
    Duration,
}

#[derive(Debug, Clone, Copy)]
enum Ty {
    Prim(Prim),
    /// An index into [`Ros::types`].
    Msg(usize),
}

#[derive(Debug, Clone, Copy)]
enum Array {
    No,
    Fixed(usize),
    Seq,
}

#[derive(Debug)]
struct Field {
    name: Arc<str>,
    ty: Ty,
    array: Array,
}

/// The decoder of one channel: its root type and those it uses, resolved.
#[derive(Debug)]
pub struct Ros {
    dialect: Dialect,
    /// `types[0]` is the root.
    types: Vec<Vec<Field>>,
}

/// The unresolved definitions of a schema, by `package/Type`.
struct Sections<'a> {
    texts: HashMap<String, &'a str>,
    /// `package/Type` → its index in `types`, once resolved (or being resolved).
    done: HashMap<String, usize>,
    types: Vec<Option<Vec<Field>>>,
    dialect: Dialect,
}

/// `pkg/msg/Type` → `pkg/Type`.
fn normal(name: &str) -> String {
    match name.split('/').collect::<Vec<_>>()[..] {
        [pkg, "msg", ty] => format!("{pkg}/{ty}"),
        _ => name.to_owned(),
    }
}

fn prim(name: &str, dialect: Dialect) -> Option<Prim> {
    let base = name.split("<=").next().unwrap_or(name);
    Some(match base {
        "bool" => Prim::Bool,
        "int8" => Prim::I8,
        "byte" if dialect == Dialect::Ros1 => Prim::I8,
        "uint8" | "char" | "byte" => Prim::U8,
        "int16" => Prim::I16,
        "uint16" => Prim::U16,
        "int32" => Prim::I32,
        "uint32" => Prim::U32,
        "int64" => Prim::I64,
        "uint64" => Prim::U64,
        "float32" => Prim::F32,
        "float64" => Prim::F64,
        "string" => Prim::Str,
        "time" if dialect == Dialect::Ros1 => Prim::Time,
        "duration" if dialect == Dialect::Ros1 => Prim::Duration,
        _ => return None,
    })
}

const BUILTIN_TIME: &str = "int32 sec\nuint32 nanosec\n";

impl<'a> Sections<'a> {
    /// Resolves type `name` (seen from package `pkg`), giving its index.
    fn resolve(&mut self, name: &str, pkg: &str, depth: usize) -> Result<usize, String> {
        let key = self.find(name, pkg)?;
        if let Some(&i) = self.done.get(&key) {
            if self.types[i].is_none() {
                return Err(format!("`{key}` contains itself"));
            }
            return Ok(i);
        }
        if depth > MAX_DEPTH {
            return Err(format!("types nest deeper than {MAX_DEPTH}"));
        }
        let i = self.types.len();
        self.types.push(None);
        self.done.insert(key.clone(), i);
        let text = self.texts.get(&key).copied().unwrap_or(BUILTIN_TIME);
        let own_pkg = key.split('/').next().unwrap_or_default().to_owned();
        let mut fields = Vec::new();
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default().trim();
            let mut words = line.split_whitespace();
            let (Some(ty), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            if name.contains('=') || words.next().is_some_and(|w| w.starts_with('=')) {
                continue; // a constant
            }
            let (base, array) = match ty.find('[') {
                Some(b) => {
                    let inside = ty[b + 1..].trim_end_matches(']');
                    let array = match inside.strip_prefix("<=").unwrap_or(inside) {
                        "" => Array::Seq,
                        _ if inside.starts_with("<=") => Array::Seq,
                        n => Array::Fixed(
                            n.parse()
                                .map_err(|_| format!("`{key}`: `{ty}` is not an array type"))?,
                        ),
                    };
                    (&ty[..b], array)
                }
                None => (ty, Array::No),
            };
            let ty = match prim(base, self.dialect) {
                Some(p) => Ty::Prim(p),
                None if base == "wstring" || base.starts_with("wstring<=") => {
                    return Err(format!("`{key}`.{name}: wstring fields are not read"))
                }
                None => Ty::Msg(self.resolve(base, &own_pkg, depth + 1)?),
            };
            fields.push(Field {
                name: Arc::from(name),
                ty,
                array,
            });
        }
        self.types[i] = Some(fields);
        Ok(i)
    }

    /// The `package/Type` key a field's type names.
    fn find(&self, name: &str, pkg: &str) -> Result<String, String> {
        let name = normal(name);
        let builtin = |k: &str| {
            self.dialect == Dialect::Ros2
                && matches!(k, "builtin_interfaces/Time" | "builtin_interfaces/Duration")
        };
        if name.contains('/') {
            if self.texts.contains_key(&name) || builtin(&name) {
                return Ok(name);
            }
        } else {
            let candidates = [
                format!("{pkg}/{name}"),
                if name == "Header" {
                    "std_msgs/Header".to_owned()
                } else {
                    String::new()
                },
            ];
            if let Some(c) = candidates.iter().find(|c| self.texts.contains_key(*c)) {
                return Ok(c.clone());
            }
            let suffix = format!("/{name}");
            if let Some(k) = self.texts.keys().find(|k| k.ends_with(&suffix)) {
                return Ok(k.clone());
            }
        }
        Err(format!(
            "type `{name}` is used but not defined in the schema (it defines {})",
            {
                let mut known: Vec<&str> = self.texts.keys().map(String::as_str).collect();
                known.sort();
                known.join(", ")
            }
        ))
    }
}

/// The sections of a concatenated schema: the first is `root`'s, each next one follows a
/// line of `=` and a line `{header} package/Type`.
fn split<'a>(text: &'a str, header: &str, root: &str) -> Vec<(String, &'a str)> {
    let mut out = Vec::new();
    let (mut current, mut start, mut offset) = (root.to_owned(), 0, 0);
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if trimmed.len() >= 3 && trimmed.chars().all(|c| c == '=') {
            out.push((current.clone(), &text[start..offset]));
            start = offset + line.len();
        } else if let Some(t) = trimmed.strip_prefix(header) {
            current = normal(t.trim());
            start = offset + line.len();
        }
        offset += line.len();
    }
    out.push((current, &text[start..]));
    out
}

impl Ros {
    pub fn new(dialect: Dialect, name: &str, encoding: &str, schema: &[u8]) -> Result<Ros, String> {
        let idl = dialect == Dialect::Ros2 && encoding.eq_ignore_ascii_case("ros2idl");
        let wanted = match dialect {
            Dialect::Ros1 => "ros1msg",
            Dialect::Ros2 => "ros2msg",
        };
        if !idl && !encoding.eq_ignore_ascii_case(wanted) {
            return Err(format!(
                "a {} channel needs a `{wanted}` schema, not `{encoding}`",
                wanted.trim_end_matches("msg")
            ));
        }
        let text = std::str::from_utf8(schema)
            .map_err(|_| format!("schema `{name}` is not UTF-8 text"))?;
        let root = normal(name);
        // IDL is read into `.msg` lines first: the definitions the sections borrow.
        let converted: Vec<(String, String)> = match idl {
            true => (split(text, "IDL:", &root).into_iter())
                .map(|(_, idl)| super::idl::to_msg(idl))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("schema `{name}` (ros2idl): {e}"))?
                .into_iter()
                .flatten()
                .collect(),
            false => Vec::new(),
        };
        let texts: HashMap<String, &str> = match idl {
            true => (converted.iter())
                .map(|(k, v)| (k.clone(), v.as_str()))
                .collect(),
            false => split(text, "MSG:", &root).into_iter().collect(),
        };
        let mut sections = Sections {
            texts,
            done: HashMap::new(),
            types: Vec::new(),
            dialect,
        };
        let pkg = root.split('/').next().unwrap_or_default().to_owned();
        sections.resolve(&root, &pkg, 0)?;
        let types = sections
            .types
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        Ok(Ros { dialect, types })
    }

    pub fn decode(&self, data: &[u8]) -> Result<Dyn, String> {
        let mut c = match self.dialect {
            Dialect::Ros1 => Cursor::new(data, 0, false),
            Dialect::Ros2 => {
                let kind = data.get(..4).ok_or("shorter than a CDR header")?;
                match [kind[0], kind[1]] {
                    [0, 0] => Cursor::new(data, 4, true),
                    [0, 1] => Cursor::new(data, 4, false),
                    [a, b] => {
                        return Err(format!(
                            "CDR encapsulation {:#06x} is not plain CDR (0x0000 or 0x0001)",
                            u16::from_be_bytes([a, b])
                        ))
                    }
                }
            }
        };
        let v = self.message(&mut c, 0)?;
        if self.dialect == Dialect::Ros1 && c.pos != data.len() {
            return Err(format!(
                "{} byte(s) left over after the message: the schema does not fit it",
                data.len() - c.pos
            ));
        }
        Ok(v)
    }

    fn message(&self, c: &mut Cursor<'_>, ty: usize) -> Result<Dyn, String> {
        let fields = &self.types[ty];
        if fields.is_empty() && self.dialect == Dialect::Ros2 {
            c.take(1, 1)?; // an empty ROS 2 message is one byte on the wire
        }
        let mut out = Vec::with_capacity(fields.len());
        for f in fields {
            let v = match f.array {
                Array::No => self.one(c, f.ty)?,
                Array::Fixed(n) => self.many(c, f.ty, n)?,
                Array::Seq => {
                    let n = c.u32()? as usize;
                    self.many(c, f.ty, n)?
                }
            };
            out.push((f.name.clone(), v));
        }
        Ok(Dyn::Map(out))
    }

    fn many(&self, c: &mut Cursor<'_>, ty: Ty, n: usize) -> Result<Dyn, String> {
        if n > c.left() {
            return Err(format!(
                "an array of {n} element(s) at byte {} with {} byte(s) left",
                c.pos,
                c.left()
            ));
        }
        if let Ty::Prim(Prim::U8) = ty {
            return Ok(Dyn::Bytes(Arc::from(c.take(n, 1)?)));
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.one(c, ty)?);
        }
        Ok(Dyn::List(items))
    }

    fn one(&self, c: &mut Cursor<'_>, ty: Ty) -> Result<Dyn, String> {
        let p = match ty {
            Ty::Msg(i) => return self.message(c, i),
            Ty::Prim(p) => p,
        };
        Ok(match p {
            Prim::Bool => Dyn::Bool(c.take(1, 1)?[0] != 0),
            Prim::I8 => Dyn::Int(i64::from(c.take(1, 1)?[0] as i8)),
            Prim::U8 => Dyn::Uint(u64::from(c.take(1, 1)?[0])),
            Prim::I16 => Dyn::Int(i64::from(i16::from_le_bytes(c.fixed::<2>()?))),
            Prim::U16 => Dyn::Uint(u64::from(u16::from_le_bytes(c.fixed::<2>()?))),
            Prim::I32 => Dyn::Int(i64::from(i32::from_le_bytes(c.fixed::<4>()?))),
            Prim::U32 => Dyn::Uint(u64::from(c.u32()?)),
            Prim::I64 => Dyn::Int(i64::from_le_bytes(c.fixed::<8>()?)),
            Prim::U64 => Dyn::Uint(u64::from_le_bytes(c.fixed::<8>()?)),
            Prim::F32 => Dyn::Float(f64::from(f32::from_le_bytes(c.fixed::<4>()?))),
            Prim::F64 => Dyn::Float(f64::from_le_bytes(c.fixed::<8>()?)),
            Prim::Str => {
                let n = c.u32()? as usize;
                let mut bytes = c.take(n, 1)?;
                if self.dialect == Dialect::Ros2 {
                    bytes = bytes.strip_suffix(&[0]).unwrap_or(bytes);
                }
                let s = std::str::from_utf8(bytes)
                    .map_err(|_| format!("a string at byte {} is not UTF-8", c.pos - n))?;
                Dyn::Text(Arc::from(s))
            }
            Prim::Time => Dyn::Map(vec![
                ("secs".into(), Dyn::Uint(u64::from(c.u32()?))),
                ("nsecs".into(), Dyn::Uint(u64::from(c.u32()?))),
            ]),
            Prim::Duration => Dyn::Map(vec![
                ("secs".into(), Dyn::Int(i64::from(c.u32()? as i32))),
                ("nsecs".into(), Dyn::Int(i64::from(c.u32()? as i32))),
            ]),
        })
    }
}

/// A payload being read: CDR aligns each primitive to its size from `origin` (after
/// the encapsulation header); ROS 1 does not align.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    origin: usize,
    big_endian: bool,
    aligned: bool,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8], origin: usize, big_endian: bool) -> Cursor<'a> {
        Cursor {
            data,
            pos: origin,
            origin,
            big_endian,
            aligned: origin > 0,
        }
    }

    fn left(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    /// `n` bytes, after aligning to `align`.
    fn take(&mut self, n: usize, align: usize) -> Result<&'a [u8], String> {
        if self.aligned && align > 1 {
            let rel = self.pos - self.origin;
            self.pos = self.origin + rel.div_ceil(align) * align;
        }
        let end = self.pos.checked_add(n).filter(|e| *e <= self.data.len());
        let Some(end) = end else {
            return Err(format!(
                "the payload ends at byte {} where {n} more byte(s) were to be read at {}",
                self.data.len(),
                self.pos
            ));
        };
        let out = &self.data[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// `N` bytes in little-endian order, whatever the payload's.
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut b: [u8; N] = self.take(N, N)?.try_into().map_err(|_| "short read")?;
        if self.big_endian {
            b.reverse();
        }
        Ok(b)
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.fixed::<4>()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMU: &str = "std_msgs/Header header\ngeometry_msgs/Vector3 linear_acceleration\nfloat64[9] cov\nint32 KIND=3 # a constant\n================================================================================\nMSG: std_msgs/Header\nbuiltin_interfaces/Time stamp\nstring frame_id\n================================================================================\nMSG: geometry_msgs/Vector3\nfloat64 x\nfloat64 y 0.0\nfloat64 z\n";

    #[test]
    fn a_rosbag2_schema_and_its_dependencies_decode_a_cdr_payload() {
        let r = Ros::new(
            Dialect::Ros2,
            "sensor_msgs/msg/Imu",
            "ros2msg",
            IMU.as_bytes(),
        )
        .unwrap();
        let mut p = vec![0, 1, 0, 0];
        p.extend(7i32.to_le_bytes()); // sec
        p.extend(9u32.to_le_bytes()); // nanosec
        p.extend(4u32.to_le_bytes()); // "imu\0"
        p.extend(b"imu\0");
        // already at an offset of 16 from the origin: aligned for float64
        for v in [1.5f64, -2.0, 9.81] {
            p.extend(v.to_le_bytes());
        }
        for i in 0..9 {
            p.extend(f64::from(i).to_le_bytes());
        }
        let d = r.decode(&p).unwrap();
        let at = |s: &str| d.at(&s.parse::<super::super::Path>().unwrap().segs);
        assert_eq!(at("header.stamp.sec"), Ok(Dyn::Int(7)));
        assert_eq!(at("header.frame_id"), Ok(Dyn::Text("imu".into())));
        assert_eq!(at("linear_acceleration.z"), Ok(Dyn::Float(9.81)));
        assert_eq!(at("cov[8]"), Ok(Dyn::Float(8.0)));
        assert!(r.decode(&p[..20]).unwrap_err().contains("the payload ends"));
    }

    #[test]
    fn schemas_that_cannot_be_read_say_why() {
        let e = Ros::new(Dialect::Ros2, "a/msg/A", "ros2msg", b"b/B x\n").unwrap_err();
        assert!(e.contains("`b/B` is used but not defined"), "{e}");
        let e = Ros::new(Dialect::Ros2, "a/A", "ros2msg", b"A inner\n").unwrap_err();
        assert!(e.contains("contains itself"), "{e}");
        let e = Ros::new(
            Dialect::Ros2,
            "a/A",
            "ros2idl",
            b"module a { enum E { X }; };",
        )
        .unwrap_err();
        assert!(
            e.contains("(ros2idl): `enum` declarations are not read"),
            "{e}"
        );
        let e = Ros::new(Dialect::Ros1, "a/A", "ros2idl", b"").unwrap_err();
        assert!(e.contains("needs a `ros1msg` schema"), "{e}");
    }

    #[test]
    fn an_array_longer_than_its_payload_is_refused_before_it_is_allocated() {
        let r = Ros::new(Dialect::Ros1, "a/A", "ros1msg", b"float64[] xs\n").unwrap();
        let e = r.decode(&u32::MAX.to_le_bytes()).unwrap_err();
        assert!(e.contains("an array of 4294967295"), "{e}");
    }
}

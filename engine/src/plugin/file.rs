//! The step file (`plugins/NAME/step.yaml`): what a reusable step declares — its name,
//! version, typed params, inputs, outputs and the command it runs — read like a pipeline,
//! with every problem located in that file.

use std::collections::HashSet;

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::de::from_node;
use crate::diag::{did_you_mean, one_of, Diagnostic};
use crate::spec::{CacheSpec, DistributedSpec, ResourcesSpec, RetrySpec, RunSpec};
use crate::template::{Ref, Template};
use crate::yaml::{self, Node, YamlPath};

/// A step file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepFileSpec {
    /// Always `step`.
    pub kind: String,
    /// The step's name (a DNS-1123 label), as `uses: NAME@VERSION` finds it.
    pub name: String,
    /// Its version (`1.0.0`): part of every cache key and of lineage.
    pub version: String,
    /// One line for `drivetrain steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The params a stage gives in `with:`, typed; read in `run` as `{{ with.NAME }}`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub params: IndexMap<String, ParamDecl>,
    /// The inputs it reads, by name (`{required: false}` for an optional one).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub inputs: IndexMap<String, InputDecl>,
    /// The outputs it writes; a stage using it may declare any subset (default: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// What it runs: `command` (and `args`), `env`, `image`, and `workdir` relative to
    /// the step file's folder (`{{ step.dir }}` names that folder).
    pub run: RunSpec,
    /// Defaults a stage may override, field by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distributed: Option<DistributedSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<RetrySpec>,
    /// A duration: `90s`, `15m`, `2h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// A typed param of a step (a small JSON Schema).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParamDecl {
    #[serde(rename = "type")]
    pub kind: ValueType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The value when the stage gives none; a param without one is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// The allowed values.
    #[serde(default, rename = "enum", skip_serializing_if = "Option::is_none")]
    pub allowed: Option<Vec<Value>>,
    /// For numbers and integers: the least allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<f64>,
    /// For numbers and integers: the most allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<f64>,
    /// For strings: a regular expression the whole value matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

/// The JSON types a param may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    String,
    Integer,
    Number,
    Boolean,
    Array,
    Object,
}

impl ValueType {
    pub fn as_str(self) -> &'static str {
        match self {
            ValueType::String => "string",
            ValueType::Integer => "integer",
            ValueType::Number => "number",
            ValueType::Boolean => "boolean",
            ValueType::Array => "array",
            ValueType::Object => "object",
        }
    }

    /// Whether `v` is of this type (an integer is a number too).
    pub fn admits(self, v: &Value) -> bool {
        match self {
            ValueType::String => v.is_string(),
            ValueType::Integer => v.is_i64() || v.is_u64(),
            ValueType::Number => v.is_number(),
            ValueType::Boolean => v.is_boolean(),
            ValueType::Array => v.is_array(),
            ValueType::Object => v.is_object(),
        }
    }
}

/// An input a step reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InputDecl {
    /// Default true.
    #[serde(default = "yes")]
    pub required: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn yes() -> bool {
    true
}

/// The fields of a step file, for hints.
const FIELDS: &[&str] = &[
    "kind",
    "name",
    "version",
    "summary",
    "params",
    "inputs",
    "outputs",
    "run",
    "resources",
    "distributed",
    "cache",
    "retries",
    "timeout",
];

/// A step file read and checked: its spec, and the line of each param's declaration.
#[derive(Debug, Clone)]
pub struct Checked {
    pub spec: StepFileSpec,
    /// Each param's line (1-based) in the file.
    pub lines: IndexMap<String, u32>,
}

/// The JSON Schema of a step file, for editors.
pub fn json_schema() -> Value {
    let schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<StepFileSpec>();
    let mut value = serde_json::to_value(schema).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.insert("title".into(), "drivetrain step file".into());
    }
    value
}

/// Whether `src` is a step file (`kind: step` at its top) rather than a pipeline.
pub fn is_step_file(src: &str) -> bool {
    src.lines().any(|l| {
        let l = l.split('#').next().unwrap_or_default().trim_end();
        l.strip_prefix("kind:")
            .is_some_and(|k| matches!(k.trim(), "step" | "\"step\"" | "'step'"))
    })
}

/// Reads and checks a step file's text: the spec, or every problem located in it.
pub fn check(src: &str) -> Result<Checked, Vec<Diagnostic>> {
    let root = yaml::parse(src)?;
    let mut diags = Vec::new();
    let spec: Option<StepFileSpec> = from_node(&root, &YamlPath::root(), &mut diags);
    let Some(spec) = spec else {
        return Err(locate(&root, diags));
    };
    let mut lines = IndexMap::new();
    for name in spec.params.keys() {
        let loc = root.locate(&YamlPath::root().key("params").key(name));
        lines.insert(name.clone(), loc.key_span.unwrap_or(loc.node.span).line);
    }
    check_spec(&spec, &mut diags);
    match diags.iter().any(Diagnostic::is_error) {
        true => Err(locate(&root, diags)),
        false => Ok(Checked { spec, lines }),
    }
}

/// Locates diagnostics reported by path only.
fn locate(root: &Node<'_>, mut diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    for d in &mut diags {
        if d.span.is_none() {
            let path = YamlPath::parse(d.path.as_deref().unwrap_or_default());
            let loc = root.locate(&path);
            d.span = Some(loc.key_span.filter(|_| loc.exact).unwrap_or(loc.node.span));
        }
        if d.code == "unknown-field" && d.path.as_deref().is_some_and(|p| !p.contains('.')) {
            d.notes.push(format!("a step file has {}", one_of(FIELDS)));
        }
    }
    diags.sort_by_key(|d| d.span.map(|s| (s.start, s.end)).unwrap_or_default());
    diags
}

fn err(diags: &mut Vec<Diagnostic>, code: &'static str, path: YamlPath, msg: impl Into<String>) {
    diags.push(Diagnostic::new(code, msg).path(path));
}

fn check_spec(spec: &StepFileSpec, diags: &mut Vec<Diagnostic>) {
    let root = YamlPath::root();
    if spec.kind != "step" {
        err(
            diags,
            "invalid-kind",
            root.key("kind"),
            format!(
                "`kind: {}` is not a step file; write `kind: step`",
                spec.kind
            ),
        );
    }
    if let Err(why) = crate::names::dns1123_label(&spec.name) {
        err(
            diags,
            "invalid-step-name",
            root.key("name"),
            format!("step name `{}` {why}", spec.name),
        );
    }
    let bad_version = spec.version.is_empty()
        || spec
            .version
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_')));
    if bad_version {
        err(
            diags,
            "invalid-version",
            root.key("version"),
            format!(
                "version `{}` must be letters, digits, `.`, `-`, `+` and `_` (`1.0.0`)",
                spec.version
            ),
        );
    }
    for (name, decl) in &spec.params {
        check_param(name, decl, &root.key("params").key(name), diags);
    }
    let mut seen = HashSet::new();
    for (i, o) in spec.outputs.iter().enumerate() {
        if !crate::names::is_ident(o) || !seen.insert(o) {
            err(
                diags,
                "invalid-output-name",
                root.key("outputs").index(i),
                format!(
                    "output `{o}` is declared twice or is not a name (letters, digits, `_`, `-`)"
                ),
            );
        }
    }
    check_run(spec, diags);
}

/// A param's declaration: its default, enum values and bounds fit its type.
fn check_param(name: &str, decl: &ParamDecl, path: &YamlPath, diags: &mut Vec<Diagnostic>) {
    if !crate::names::is_ident(name) || name.contains('-') {
        err(
            diags,
            "invalid-param-name",
            path.clone(),
            format!("param name `{name}` must hold only letters, digits and `_`"),
        );
    }
    let numeric = matches!(decl.kind, ValueType::Integer | ValueType::Number);
    for (field, set) in [
        ("minimum", decl.minimum.is_some()),
        ("maximum", decl.maximum.is_some()),
    ] {
        if set && !numeric {
            err(
                diags,
                "invalid-param",
                path.key(field),
                format!(
                    "`{field}` bounds numbers; `{name}` is a {}",
                    decl.kind.as_str()
                ),
            );
        }
    }
    if let Some(p) = &decl.pattern {
        if decl.kind != ValueType::String {
            err(
                diags,
                "invalid-param",
                path.key("pattern"),
                format!(
                    "`pattern` matches strings; `{name}` is a {}",
                    decl.kind.as_str()
                ),
            );
        } else if let Err(e) = regex::Regex::new(p) {
            err(
                diags,
                "invalid-param",
                path.key("pattern"),
                format!("`pattern` is not a regular expression: {e}"),
            );
        }
    }
    let mut values: Vec<(YamlPath, &Value)> = Vec::new();
    if let Some(d) = &decl.default {
        values.push((path.key("default"), d));
    }
    for (i, v) in decl.allowed.iter().flatten().enumerate() {
        values.push((path.key("enum").index(i), v));
    }
    for (vp, v) in values {
        if let Err(why) = admits(decl, v, false) {
            err(diags, "invalid-param", vp, format!("`{name}`: {why}"));
        }
    }
}

/// The command's templates read only what a step is given: `with.NAME` of a declared
/// param, `step.dir`, its declared inputs and outputs, and the run's own facts.
fn check_run(spec: &StepFileSpec, diags: &mut Vec<Diagnostic>) {
    let rp = YamlPath::root().key("run");
    if spec.run.command.is_empty() {
        err(
            diags,
            "empty-command",
            rp.key("command"),
            "`command` is empty; it needs at least the program",
        );
    }
    let mut strings: Vec<(YamlPath, &str)> = Vec::new();
    for (i, a) in spec.run.command.iter().enumerate() {
        strings.push((rp.key("command").index(i), a));
    }
    for (i, a) in spec.run.args.iter().enumerate() {
        strings.push((rp.key("args").index(i), a));
    }
    for (k, v) in &spec.run.env {
        strings.push((rp.key("env").key(k), v));
    }
    if let Some(i) = &spec.run.image {
        strings.push((rp.key("image"), i));
    }
    if let Some(w) = &spec.run.workdir {
        strings.push((rp.key("workdir"), w));
        if std::path::Path::new(w).is_absolute() || leaves(w) {
            err(diags, "path-escapes", rp.key("workdir"), format!(
                "`workdir: {w}` leaves the step's folder; a step's paths are relative to its step file"
            ));
        }
    }
    for (path, text) in strings {
        let t = match Template::parse(text) {
            Ok(t) => t,
            Err(errors) => {
                for e in errors {
                    err(diags, "invalid-template", path.clone(), e.message);
                }
                continue;
            }
        };
        if t.parts
            .iter()
            .all(|p| matches!(p, crate::template::Part::Lit(_)))
            && leaves(text)
        {
            err(
                diags,
                "path-escapes",
                path.clone(),
                format!(
                    "`{text}` leaves the step's folder; a step names only files in its own folder"
                ),
            );
        }
        for (r, _) in t.refs() {
            if let Some(why) = unreadable(spec, r) {
                err(diags, "invalid-reference", path.clone(), why);
            }
        }
    }
}

/// Whether a relative path climbs out of the folder it is read from.
pub(crate) fn leaves(path: &str) -> bool {
    let mut depth = 0i32;
    for c in std::path::Path::new(path).components() {
        match c {
            std::path::Component::ParentDir => depth -= 1,
            std::path::Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

/// Why a step file may not read `r`, if it may not.
fn unreadable(spec: &StepFileSpec, r: &Ref) -> Option<String> {
    let declared = |names: Vec<&str>, what: &str, name: &str| {
        let hint = did_you_mean(name, names.iter().copied())
            .map(|h| format!("; {h}"))
            .unwrap_or_default();
        format!(
            "the step declares no {what} `{name}` ({}){hint}",
            one_of(&names)
        )
    };
    match r {
        Ref::With(name) if !spec.params.contains_key(name) => {
            Some(declared(spec.params.keys().map(String::as_str).collect(), "param", name))
        }
        Ref::Input(name) if !spec.inputs.contains_key(name) => {
            Some(declared(spec.inputs.keys().map(String::as_str).collect(), "input", name))
        }
        Ref::Output(name) if !spec.outputs.contains(name) => {
            Some(declared(spec.outputs.iter().map(String::as_str).collect(), "output", name))
        }
        Ref::With(_) | Ref::Input(_) | Ref::Output(_) | Ref::StepDir => None,
        Ref::RunId | Ref::RunDate | Ref::PipelineName | Ref::ScheduleTime => None,
        other => Some(format!(
            "a step file reads `{other}` only through a param: declare one under `params` and let the stage pass it in `with:`"
        )),
    }
}

/// Whether `v` fits `decl`; `templated`: a string holding `{{ … }}` stands for a value
/// known only when the stage runs, so only a string param's own checks can refuse it…
/// and those wait for the value too.
pub(super) fn admits(decl: &ParamDecl, v: &Value, templated: bool) -> Result<(), String> {
    let is_template = templated && v.as_str().is_some_and(|s| s.contains("{{"));
    if is_template {
        return Ok(());
    }
    if !decl.kind.admits(v) {
        return Err(format!(
            "expected {}, found {}",
            decl.kind.article(),
            describe(v)
        ));
    }
    if let Some(allowed) = &decl.allowed {
        if !allowed.contains(v) {
            let shown: Vec<String> = allowed.iter().map(Value::to_string).collect();
            return Err(format!("{v} is not one of {}", shown.join(", ")));
        }
    }
    if let Some(n) = v.as_f64() {
        if let Some(min) = decl.minimum.filter(|m| n < *m) {
            return Err(format!("{v} is below the minimum {min}"));
        }
        if let Some(max) = decl.maximum.filter(|m| n > *m) {
            return Err(format!("{v} is above the maximum {max}"));
        }
    }
    if let (Some(p), Some(s)) = (&decl.pattern, v.as_str()) {
        let whole = format!("^(?:{p})$");
        if regex::Regex::new(&whole).is_ok_and(|re| !re.is_match(s)) {
            return Err(format!("\"{s}\" does not match the pattern `{p}`"));
        }
    }
    Ok(())
}

impl ValueType {
    /// `a string`, `an integer`, …
    pub fn article(self) -> &'static str {
        match self {
            ValueType::String => "a string",
            ValueType::Integer => "an integer",
            ValueType::Number => "a number",
            ValueType::Boolean => "a boolean",
            ValueType::Array => "an array",
            ValueType::Object => "an object",
        }
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) if n.is_f64() => format!("the number {n}"),
        Value::Number(n) => format!("the integer {n}"),
        Value::String(s) => format!("the string \"{}\"", crate::diag::clip(s.clone())),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

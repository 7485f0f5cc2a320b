//! Templates: `{{ params.date }}` inside argv elements, environment values, images and
//! step config strings.
//!
//! A template is parsed once into literal parts and [`Ref`]s, checked statically against
//! the pipeline (unknown params, inputs, outputs, stages), and rendered later by
//! substituting each reference's value into that one string. The rendered string is one
//! argv element or one environment value: nothing is ever handed to a shell, so a value
//! containing `; rm -rf /` is just an odd argument.

use std::fmt;
use std::ops::Range;

/// A reference to a value known at run time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ref {
    /// `params.NAME`
    Param(String),
    /// `run.id`
    RunId,
    /// `run.date`: the run's start date (or the scheduled date), `YYYY-MM-DD`.
    RunDate,
    /// `run.status`: in a hook stage, how the rest of the run ended (`Succeeded`,
    /// `Failed`, …); `Running` elsewhere.
    RunStatus,
    /// `pipeline.name`
    PipelineName,
    /// `pipeline.dir`: the folder of the pipeline's file, where a relative `workdir` and
    /// the relative paths of a command are read from (none for YAML posted to a server).
    PipelineDir,
    /// `schedule.time`: the scheduled time (RFC 3339) of a cron run; the submit time
    /// of other runs.
    ScheduleTime,
    /// `inputs.NAME`: the local directory (or URL) of an input.
    Input(String),
    /// `outputs.NAME`: the local directory (or URL) an output is written to.
    Output(String),
    /// `stages.STAGE.values.KEY…`: a small value from the stage's `values.json`.
    StageValue { stage: String, key: Vec<String> },
    /// `item` or `item.KEY…` inside a `map` stage.
    Item(Vec<String>),
    /// `trial.id`, `trial.budget` or `trial.params.NAME` inside a stage with `search`.
    Trial(TrialRef),
    /// `with.NAME`, in a step file only: the param a stage gave in `with:` (or its
    /// default), put in place when the stage is planned.
    With(String),
    /// `step.dir`, in a step file only: the plugin's folder.
    StepDir,
}

/// What of a search's trial a template reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrialRef {
    /// Its id (`t007`).
    Id,
    /// The budget this attempt trains to.
    Budget,
    /// One of its params.
    Param(String),
}

/// The roots a reference can start with, for hints.
pub const ROOTS: &[&str] = &[
    "params", "run", "pipeline", "schedule", "inputs", "outputs", "stages", "item", "trial",
    "with", "step",
];

/// A dotted reference that names nothing, with what it could have been.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("`{path}` is not a reference")]
    Malformed { path: String },
    #[error("unknown reference `{root}.{field}`; `{root}` has {known}")]
    UnknownField {
        root: &'static str,
        field: String,
        known: &'static str,
    },
    #[error("`{path}` is not a reference; stage values are read as `stages.{stage}.values.KEY`")]
    NotAStageValue { path: String, stage: String },
    #[error("`{path}` is not a reference; write `{root}.NAME`")]
    NoName { path: String, root: String },
    #[error("unknown reference root `{root}` in `{path}`{}",
        .hint.as_ref().map(|h| format!("; {h}")).unwrap_or_default())]
    UnknownRoot {
        root: String,
        path: String,
        hint: Option<String>,
    },
}

impl Ref {
    /// Parses a dotted reference (`stages.validate.values.passed`).
    pub fn parse(path: &str) -> Result<Ref, RefError> {
        let segs: Vec<&str> = path.split('.').collect();
        if segs.iter().any(|s| s.is_empty()) {
            return Err(RefError::Malformed {
                path: path.to_owned(),
            });
        }
        let rest = |n: usize| {
            segs[n..]
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>()
        };
        let unknown = |root, field: &str, known| RefError::UnknownField {
            root,
            field: field.to_owned(),
            known,
        };
        match segs.as_slice() {
            ["params", name] => Ok(Ref::Param((*name).to_owned())),
            ["run", "id"] => Ok(Ref::RunId),
            ["run", "date"] => Ok(Ref::RunDate),
            ["run", "status"] => Ok(Ref::RunStatus),
            ["pipeline", "name"] => Ok(Ref::PipelineName),
            ["pipeline", "dir"] => Ok(Ref::PipelineDir),
            ["schedule", "time"] => Ok(Ref::ScheduleTime),
            ["inputs", name] => Ok(Ref::Input((*name).to_owned())),
            ["outputs", name] => Ok(Ref::Output((*name).to_owned())),
            ["stages", stage, "values", _, ..] => Ok(Ref::StageValue {
                stage: (*stage).to_owned(),
                key: rest(3),
            }),
            ["item", ..] => Ok(Ref::Item(rest(1))),
            ["trial", "id"] => Ok(Ref::Trial(TrialRef::Id)),
            ["trial", "budget"] => Ok(Ref::Trial(TrialRef::Budget)),
            ["trial", "params", name] => Ok(Ref::Trial(TrialRef::Param((*name).to_owned()))),
            ["with", name] => Ok(Ref::With((*name).to_owned())),
            ["step", "dir"] => Ok(Ref::StepDir),
            ["step", other, ..] => Err(unknown("step", other, "`dir`")),
            ["trial", other, ..] => {
                Err(unknown("trial", other, "`id`, `budget` and `params.NAME`"))
            }
            ["run", other] => Err(unknown("run", other, "`id`, `date` and `status`")),
            ["schedule", other] => Err(unknown("schedule", other, "`time`")),
            ["pipeline", other] => Err(unknown("pipeline", other, "`name` and `dir`")),
            ["stages", stage, ..] => Err(RefError::NotAStageValue {
                path: path.to_owned(),
                stage: (*stage).to_owned(),
            }),
            [root, ..] if ROOTS.contains(root) => Err(RefError::NoName {
                path: path.to_owned(),
                root: (*root).to_owned(),
            }),
            [root, ..] => Err(RefError::UnknownRoot {
                root: (*root).to_owned(),
                path: path.to_owned(),
                hint: crate::diag::did_you_mean(root, ROOTS.iter().copied()),
            }),
            // `split` yields at least one segment, and an empty one is malformed above.
            [] => Err(RefError::Malformed {
                path: path.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Ref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ref::Param(n) => write!(f, "params.{n}"),
            Ref::RunId => f.write_str("run.id"),
            Ref::RunDate => f.write_str("run.date"),
            Ref::RunStatus => f.write_str("run.status"),
            Ref::PipelineName => f.write_str("pipeline.name"),
            Ref::PipelineDir => f.write_str("pipeline.dir"),
            Ref::ScheduleTime => f.write_str("schedule.time"),
            Ref::Input(n) => write!(f, "inputs.{n}"),
            Ref::Output(n) => write!(f, "outputs.{n}"),
            Ref::StageValue { stage, key } => write!(f, "stages.{stage}.values.{}", key.join(".")),
            Ref::Item(k) if k.is_empty() => f.write_str("item"),
            Ref::Item(k) => write!(f, "item.{}", k.join(".")),
            Ref::Trial(TrialRef::Id) => f.write_str("trial.id"),
            Ref::Trial(TrialRef::Budget) => f.write_str("trial.budget"),
            Ref::Trial(TrialRef::Param(n)) => write!(f, "trial.params.{n}"),
            Ref::With(n) => write!(f, "with.{n}"),
            Ref::StepDir => f.write_str("step.dir"),
        }
    }
}

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Lit(String),
    /// A reference and its byte range (the whole `{{ … }}`) in the source string.
    Ref(Ref, Range<usize>),
}

/// A parsed template string.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Template {
    pub parts: Vec<Part>,
}

/// A template that does not parse, with the byte range of the offending part.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateError {
    pub message: String,
    pub range: Range<usize>,
}

impl Template {
    /// Parses `s`. `{{ x }}` is a reference; a literal `{{` is written `{{ "{{" }}`.
    pub fn parse(s: &str) -> Result<Template, Vec<TemplateError>> {
        let mut parts = Vec::new();
        let mut errors = Vec::new();
        let mut lit = String::new();
        let mut rest = 0;
        while let Some(open) = s[rest..].find("{{").map(|i| i + rest) {
            lit.push_str(&s[rest..open]);
            let Some(close) = s[open + 2..].find("}}").map(|i| i + open + 2) else {
                errors.push(TemplateError {
                    message: "unclosed `{{`: a template ends with `}}`".to_owned(),
                    range: open..s.len(),
                });
                rest = s.len();
                break;
            };
            let inner = s[open + 2..close].trim();
            let range = open..close + 2;
            if let Some(quoted) = inner
                .strip_prefix('"')
                .and_then(|x| x.strip_suffix('"'))
                .or_else(|| inner.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
            {
                lit.push_str(quoted);
            } else if inner.is_empty() {
                errors.push(TemplateError {
                    message: "empty template `{{ }}`".to_owned(),
                    range: range.clone(),
                });
            } else if let Some(bad) = inner
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            {
                errors.push(TemplateError {
                    message: format!(
                        "templates hold one reference such as `params.date`; found `{bad}` in `{inner}`"
                    ),
                    range: range.clone(),
                });
            } else {
                match Ref::parse(inner) {
                    Ok(r) => {
                        if !lit.is_empty() {
                            parts.push(Part::Lit(std::mem::take(&mut lit)));
                        }
                        parts.push(Part::Ref(r, range));
                    }
                    Err(e) => errors.push(TemplateError {
                        message: e.to_string(),
                        range,
                    }),
                }
            }
            rest = close + 2;
        }
        lit.push_str(&s[rest..]);
        if !lit.is_empty() {
            parts.push(Part::Lit(lit));
        }
        // A pipeline holds tens of thousands of templates for as long as it runs.
        parts.shrink_to_fit();
        for p in &mut parts {
            if let Part::Lit(l) = p {
                l.shrink_to_fit();
            }
        }
        if errors.is_empty() {
            Ok(Template { parts })
        } else {
            Err(errors)
        }
    }

    /// The references, with their byte ranges.
    pub fn refs(&self) -> impl Iterator<Item = (&Ref, &Range<usize>)> {
        self.parts.iter().filter_map(|p| match p {
            Part::Ref(r, range) => Some((r, range)),
            Part::Lit(_) => None,
        })
    }

    /// This template with each `{{ with.NAME }}` replaced by the parts of `with(NAME)`
    /// (a step file's command, given what a stage passed): what a stage wrote stays a
    /// template of the pipeline's own references, never text parsed a second time.
    pub fn inline(&self, with: impl Fn(&str) -> Option<Template>) -> Template {
        let mut parts: Vec<Part> = Vec::with_capacity(self.parts.len());
        let mut push = |p: Part| match (parts.last_mut(), p) {
            (Some(Part::Lit(a)), Part::Lit(b)) => a.push_str(&b),
            (_, p) => parts.push(p),
        };
        for p in &self.parts {
            match p {
                Part::Ref(Ref::With(name), _) => {
                    for q in with(name).map(|t| t.parts).unwrap_or_default() {
                        push(q);
                    }
                }
                other => push(other.clone()),
            }
        }
        Template { parts }
    }

    pub fn is_literal(&self) -> bool {
        self.refs().next().is_none()
    }

    /// Renders with `value` giving each reference's text; `None` keeps the reference
    /// visible as `{{ ref }}` (for `drivetrain plan`, before a run exists).
    pub fn render(&self, mut value: impl FnMut(&Ref) -> Option<String>) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(l) => out.push_str(l),
                Part::Ref(r, _) => match value(r) {
                    Some(v) => out.push_str(&v),
                    None => {
                        out.push_str("{{ ");
                        out.push_str(&r.to_string());
                        out.push_str(" }}");
                    }
                },
            }
        }
        out
    }
}

/// The text of a JSON value as it is substituted into a string: strings bare, other
/// values as JSON (`[1,2]`, `true`).
pub fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Renders every string inside a JSON value (a step's `with:` block). A string that is
/// exactly one reference takes the referenced value with its type (`"{{ params.n }}"`
/// becomes the integer); other strings are rendered as text. Strings that are not valid
/// templates were rejected by validation and are kept as they are.
pub fn render_value(
    v: &serde_json::Value,
    lookup: &dyn Fn(&Ref) -> Option<serde_json::Value>,
) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => match Template::parse(s) {
            Ok(t) => match t.parts.as_slice() {
                [Part::Ref(r, _)] => lookup(r).unwrap_or_else(|| v.clone()),
                _ => Value::String(t.render(|r| lookup(r).map(|x| value_text(&x)))),
            },
            Err(_) => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(|x| render_value(x, lookup)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), render_value(x, lookup)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_references_and_literals() {
        let t = Template::parse("s3://logs/{{ params.date }}/{{run.id}}").unwrap();
        assert_eq!(
            t.parts,
            vec![
                Part::Lit("s3://logs/".into()),
                Part::Ref(Ref::Param("date".into()), 10..27),
                Part::Lit("/".into()),
                Part::Ref(Ref::RunId, 28..38),
            ]
        );
    }

    #[test]
    fn rendering_never_reinterprets_values() {
        let t = Template::parse("--name={{ params.n }}").unwrap();
        let out = t.render(|_| Some("x; rm -rf / {{ params.n }}".into()));
        assert_eq!(out, "--name=x; rm -rf / {{ params.n }}");
    }

    #[test]
    fn stage_values_and_items() {
        let t =
            Template::parse("{{ stages.validate.values.metrics.iou }} {{ item.drive }}").unwrap();
        let refs: Vec<_> = t.refs().map(|(r, _)| r.clone()).collect();
        assert_eq!(
            refs,
            vec![
                Ref::StageValue {
                    stage: "validate".into(),
                    key: vec!["metrics".into(), "iou".into()]
                },
                Ref::Item(vec!["drive".into()])
            ]
        );
    }

    #[test]
    fn errors_are_ranged() {
        let e = Template::parse("a {{ parms.x }} b {{ params.y").unwrap_err();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].range, 2..15);
        assert!(e[0].message.contains("did you mean `params`"));
        assert!(e[1].message.contains("unclosed"));
    }

    #[test]
    fn json_values_keep_param_types() {
        let v = serde_json::json!({"n": "{{ params.n }}", "s": "x-{{ params.n }}", "l": ["{{ run.id }}"]});
        let out = render_value(&v, &|r| match r {
            Ref::Param(_) => Some(serde_json::json!(6)),
            _ => None,
        });
        assert_eq!(
            out,
            serde_json::json!({"n": 6, "s": "x-6", "l": ["{{ run.id }}"]})
        );
    }

    #[test]
    fn escaped_braces() {
        let t = Template::parse("{{ \"{{\" }}x}}").unwrap();
        assert_eq!(t.render(|_| None), "{{x}}");
    }

    #[test]
    fn expressions_are_not_templates() {
        let e = Template::parse("{{ params.a | upper }}").unwrap_err();
        assert!(e[0].message.contains("one reference"));
    }
}

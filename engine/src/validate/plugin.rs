//! A stage that `uses:` a plugin step (see [`crate::plugin`]): the step found, its
//! defaults under the stage's own settings, `with:` checked against its typed params, and
//! the stage planned as the step's command with what the stage passed put in place.

use std::sync::Arc;

use serde_json::Value;

use crate::plan::{Action, Output};
use crate::plugin::{Plugin, Refusal};
use crate::spec::{OutputSpec, StageSpec};
use crate::template::{Part, Ref, Template};
use crate::yaml::YamlPath;

use super::{collect_strings, Annotate, Cx, StageCx};

/// A stage's spec with its step's defaults where the stage sets none: resources field by
/// field, distribution, cache, retries and timeout; all the step's outputs when the stage
/// names none.
pub(super) fn with_step_defaults(spec: &StageSpec, plugin: &Plugin) -> StageSpec {
    let step = &plugin.checked.spec;
    let mut merged = spec.clone();
    if let Some(r) = &step.resources {
        let mut own = spec.resources.clone().unwrap_or_default();
        own.cpu = own.cpu.or_else(|| r.cpu.clone());
        own.memory = own.memory.or_else(|| r.memory.clone());
        own.gpu = own.gpu.or_else(|| r.gpu.clone());
        own.shm = own.shm.or_else(|| r.shm.clone());
        own.ephemeral_storage = own
            .ephemeral_storage
            .or_else(|| r.ephemeral_storage.clone());
        merged.resources = Some(own);
    }
    merged.distributed = merged.distributed.or_else(|| step.distributed.clone());
    merged.cache = merged.cache.or_else(|| step.cache.clone());
    merged.retries = merged.retries.or_else(|| step.retries.clone());
    merged.timeout = merged.timeout.or_else(|| step.timeout.clone());
    if merged.outputs.is_empty() {
        merged.outputs = step
            .outputs
            .iter()
            .cloned()
            .map(OutputSpec::Short)
            .collect();
    }
    merged
}

impl<'a> Cx<'a> {
    /// The plugin a stage's `uses:` names, reported at `uses` when there is none.
    pub(super) fn stage_plugin(&mut self, path: &YamlPath, uses: &str) -> Option<Arc<Plugin>> {
        match self.plugins.resolve(uses) {
            Ok(p) => Some(p),
            Err(Refusal { message, notes }) => {
                let d = self.err("unknown-step", &path.key("uses"), message);
                d.notes.extend(notes);
                None
            }
        }
    }

    /// The action of a stage using `plugin`: its `with:` checked, its command planned.
    pub(super) fn check_plugin(
        &mut self,
        sc: &mut StageCx<'_>,
        plugin: &Plugin,
        outputs: &[Output],
    ) -> Option<Action> {
        let path = sc.path.clone();
        let with_path = path.key("with");
        let typed = super::links::typed_with(sc);
        let diags = crate::plugin::params::check_with(
            plugin,
            typed.as_ref(),
            &with_path,
            &path.key("uses"),
        );
        let ok = !diags.iter().any(crate::diag::Diagnostic::is_error);
        self.diags.extend(diags);
        let step = &plugin.checked.spec;
        let declared_outputs: Vec<&str> = step.outputs.iter().map(String::as_str).collect();
        let declared_inputs: Vec<(&str, bool)> = step
            .inputs
            .iter()
            .map(|(n, d)| (n.as_str(), d.required))
            .collect();
        let name = format!("{}@{}", step.name, step.version);
        self.check_step_io(sc, (&declared_outputs, &declared_inputs), &name, outputs);
        let with = self.with_templates(sc, plugin, &with_path)?;
        let inline =
            |t: &Template| t.inline(|n| with.iter().find(|(k, _)| k == n).map(|(_, t)| t.clone()));
        let run = &step.run;
        // Without a `workdir`, an argument naming a file of the step's folder is that file.
        let names_files = run.workdir.is_none();
        let parse = |i: usize, s: &str| match names_files {
            true => step_template(plugin, i, s),
            false => step_template(plugin, usize::MAX, s),
        };
        let argv: Vec<Template> = run
            .command
            .iter()
            .chain(&run.args)
            .enumerate()
            .map(|(i, a)| inline(&parse(i, a)))
            .collect();
        sc.plugin_env = run
            .env
            .iter()
            .map(|(k, v)| (k.clone(), inline(&parse(usize::MAX, v))))
            .collect();
        let workdir = run.workdir.as_deref().map(|w| {
            let rel = w.trim_start_matches("./").trim_end_matches('/');
            inline(&match rel {
                "" | "." => Template {
                    parts: vec![step_dir()],
                },
                _ => parse(usize::MAX, &format!("{{{{ step.dir }}}}/{rel}")),
            })
        });
        let image = run.image.as_deref().map(|i| inline(&parse(usize::MAX, i)));
        ok.then_some(Action::Command {
            image,
            argv,
            workdir,
        })
    }

    /// Each param's value as a template of the pipeline's references: what the stage
    /// gave (its templates checked as any stage's), else the declared default.
    fn with_templates(
        &mut self,
        sc: &mut StageCx<'_>,
        plugin: &Plugin,
        with_path: &YamlPath,
    ) -> Option<Vec<(String, Template)>> {
        if let Some(node) = sc.with_node {
            let mut strings = Vec::new();
            collect_strings(node, with_path, &mut strings);
            for (sp, text) in strings {
                self.stage_template(sc, &sp, &text);
            }
        }
        let given = |name: &str| -> Option<Value> { Some(sc.with_node?.get(name)?.to_json()) };
        let mut out = Vec::new();
        for (name, decl) in &plugin.checked.spec.params {
            let Some(v) = given(name).or_else(|| decl.default.clone()) else {
                continue;
            };
            let t = match &v {
                Value::String(s) => Template::parse(s).ok()?,
                other => Template {
                    parts: vec![Part::Lit(other.to_string())],
                },
            };
            out.push((name.clone(), t));
        }
        Some(out)
    }

    /// `with.NAME` and `step.dir` are a step file's words; a pipeline cannot use them.
    pub(super) fn step_only_ref(
        &mut self,
        path: &YamlPath,
        r: &Ref,
        range: std::ops::Range<usize>,
    ) {
        self.err_in_string(
            "invalid-reference",
            path,
            range,
            format!("`{r}` is read only in a step file (plugins/NAME/step.yaml)"),
        )
        .hint("a stage passes a plugin step its params in `with:`");
    }
}

fn step_dir() -> Part {
    Part::Ref(Ref::StepDir, 0..0)
}

/// A template of the step file (checked when it was read). Argument `index` of the
/// command naming a file of the step's folder by a relative path is that file, written
/// `{{ step.dir }}/PATH` so that the key is the same wherever the folder is.
fn step_template(plugin: &Plugin, index: usize, s: &str) -> Template {
    let t = Template::parse(s).unwrap_or_default();
    if index != usize::MAX && t.is_literal() {
        if let Some(file) = crate::runner::folder::named_file(index, s, &plugin.id.dir) {
            let rel = file.strip_prefix(&plugin.id.dir).unwrap_or(&file);
            return Template {
                parts: vec![step_dir(), Part::Lit(format!("/{}", rel.display()))],
            };
        }
    }
    t
}

/// The `uses:` of a stage that names a plugin.
pub(super) fn uses_plugin(spec: &StageSpec) -> Option<&str> {
    spec.uses.as_deref().filter(|u| crate::plugin::is_plugin(u))
}

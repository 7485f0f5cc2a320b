//! One stage checked and resolved: its outputs, inputs, action (a command or a built-in
//! step), environment, condition, resources, retries, timeout, cache policy, volumes and
//! distribution, each problem located at its YAML path.

use std::collections::HashSet;

use crate::diag::{did_you_mean, Diagnostic};
use crate::expr::Expr;
use crate::plan::{
    Action, CachePolicy, Distributed, EdgeKind, Input, Output, Resources, RetryPolicy, Stage,
};
use crate::spec::TolerationOperator;
use crate::template::Template;
use crate::units::parse_duration;

use super::{dns1123_label, is_ident, p, Annotate, Cx, RefSite, StageCx};

impl<'a> Cx<'a> {
    pub(super) fn check_stage(&mut self, sc: &mut StageCx<'_>, executor: &str) -> Option<Stage> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();
        let outputs = self.stage_outputs(sc);
        let action = self.stage_action(sc, &outputs);
        let env = self.stage_env(sc);
        let inputs = self.stage_inputs(sc);
        self.stage_needs(sc);
        let when = self.stage_when(sc);
        let map = spec.map.as_ref().and_then(|m| self.check_map(sc, m));
        let search = spec.search.as_ref().and_then(|s| self.check_search(sc, s));
        // Scalars with units.
        let retries = match (&spec.retries, &sc.raw.defaults.retries) {
            (Some(r), _) => self.retries(&path.key("retries"), r),
            (None, Some(r)) => self.quietly(|cx| cx.retries(&p("defaults").key("retries"), r)),
            (None, None) => RetryPolicy::default(),
        };
        let timeout = match &spec.timeout {
            Some(t) => self.duration(&path.key("timeout"), t),
            None => sc
                .raw
                .defaults
                .timeout
                .as_deref()
                .and_then(|t| parse_duration(t).ok()),
        };
        let deadline = match &spec.deadline {
            Some(t) => self.duration(&path.key("deadline"), t),
            None => None,
        };
        let cache = self.stage_cache(sc);
        let resources = self.stage_resources(sc);
        let distributed = self.stage_distributed(sc);
        let scheduling = self.stage_scheduling(sc, resources.gpu.unwrap_or(0) > 0, executor);
        self.stage_volumes(sc);
        self.stage_secrets(sc);
        let image = self.stage_image(sc, executor);
        let errors_after = self.diags.iter().filter(|d| d.is_error()).count();
        if errors_after > errors_before {
            return None;
        }
        Some(Stage {
            id: sc.id,
            name: sc.name.into(),
            description: spec.description.clone(),
            action: action?,
            env,
            inputs,
            outputs,
            when,
            map,
            search,
            hook: spec.hook,
            retries,
            timeout,
            deadline,
            cache,
            resources,
            distributed,
            volumes: spec.volumes.clone(),
            snapshot: spec.snapshot.clone(),
            slurm: spec.slurm.clone(),
            scheduling,
            secrets: spec.secrets.clone(),
            node_selector: spec.node_selector.clone(),
            tolerations: spec.tolerations.clone(),
            network: spec.network.unwrap_or_default(),
            image,
            plugin: sc.plugin.clone().flatten().map(|p| p.id.clone()),
        })
    }
    /// A stage's outputs, checked first: templates refer to them.
    fn stage_outputs(&mut self, sc: &StageCx<'_>) -> Vec<Output> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let mut outputs = Vec::new();
        let mut seen = HashSet::new();
        for (i, o) in spec.outputs.iter().enumerate() {
            let op = path.key("outputs").index(i);
            if !is_ident(o.name()) {
                self.err("invalid-output-name", &op, format!(
                    "output name `{}` must start with a letter or `_` and hold only letters, digits, `_` and `-`",
                    o.name()
                ));
            } else if !seen.insert(o.name()) {
                self.err(
                    "duplicate-output",
                    &op,
                    format!("output `{}` is declared twice", o.name()),
                );
            }
            outputs.push(Output {
                name: o.name().to_owned(),
                mode: o.mode(),
            });
        }
        outputs
    }

    /// What a stage does: a built-in step (`uses`) or a command (`run`), not both.
    fn stage_action(&mut self, sc: &mut StageCx<'_>, outputs: &[Output]) -> Option<Action> {
        let spec = sc.spec;
        let path = sc.path.clone();
        if let Some(a) = &spec.approval {
            return self.approval_action(sc, a);
        }
        match (&spec.uses, &spec.run) {
            (Some(_), Some(_)) => {
                self.err_key(
                    "uses-and-run",
                    &path.key("run"),
                    "a stage has either `uses` (a built-in step) or `run` (a command), not both",
                );
                None
            }
            (None, None) => {
                self.err_key("no-action", &path, format!(
                    "stage `{}` does nothing: give it `uses` (a built-in step), `run` (a command) or `approval` (a wait for people)",
                    sc.name
                ));
                None
            }
            (Some(_), None) if sc.plugin.is_some() => {
                let plugin = sc.plugin.clone().flatten()?;
                self.check_plugin(sc, &plugin, outputs)
            }
            (Some(step_name), None) => self.check_uses(sc, step_name, outputs),
            (None, Some(run)) => self.run_action(sc, run),
        }
    }

    /// A command stage's action: argv, image and working directory as templates.
    fn run_action(&mut self, sc: &mut StageCx<'_>, run: &crate::spec::RunSpec) -> Option<Action> {
        let spec = sc.spec;
        let path = sc.path.clone();
        if spec.with.is_some() {
            self.err_key(
                "with-without-uses",
                &path.key("with"),
                "`with` configures a built-in step; this stage has `run`",
            )
            .hint("pass configuration to a command through `args` or `env`");
        }
        let rp = path.key("run");
        if run.command.is_empty() {
            self.err(
                "empty-command",
                &rp.key("command"),
                "`command` is empty; it needs at least the program",
            );
        }
        if let Some(prog) = run.command.first() {
            let is_shell_line =
                run.command.len() == 1 && prog.contains(' ') && !prog.contains("{{");
            if is_shell_line {
                self.err("shell-string", &rp.key("command").index(0), format!(
                    "`{prog}` is one argv element with spaces; drivetrain runs argv directly, never through a shell"
                ))
                .hint(format!("split it: [{}]", prog.split_whitespace().collect::<Vec<_>>().join(", ")));
            }
        }
        let argv: Vec<Template> = run
            .command
            .iter()
            .enumerate()
            .map(|(i, a)| (rp.key("command").index(i), a))
            .chain(
                run.args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (rp.key("args").index(i), a)),
            )
            .filter_map(|(ap, a)| self.stage_template(sc, &ap, a))
            .collect();
        let image = run
            .image
            .as_ref()
            .and_then(|i| self.stage_template(sc, &rp.key("image"), i));
        let workdir = run
            .workdir
            .as_ref()
            .and_then(|w| self.stage_template(sc, &rp.key("workdir"), w));
        Some(Action::Command {
            image,
            argv,
            workdir,
        })
    }

    /// An approval stage: no `uses` or `run`, nothing it runs or writes, a role to decide.
    fn approval_action(
        &mut self,
        sc: &mut StageCx<'_>,
        a: &crate::spec::ApprovalSpec,
    ) -> Option<Action> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let ap = path.key("approval");
        let mut ok = true;
        for (key, present) in [
            ("uses", spec.uses.is_some()),
            ("run", spec.run.is_some()),
            ("map", spec.map.is_some()),
            ("hook", spec.hook.is_some()),
            ("distributed", spec.distributed.is_some()),
            ("retries", spec.retries.is_some()),
            ("timeout", spec.timeout.is_some()),
            ("resources", spec.resources.is_some()),
            ("cache", spec.cache.is_some()),
            ("env", !spec.env.is_empty()),
            ("secrets", !spec.secrets.is_empty()),
            ("volumes", !spec.volumes.is_empty()),
        ] {
            if present {
                let hint = match key {
                    "timeout" => " (how long people have is `approval.timeout`)",
                    _ => "",
                };
                self.err_key(
                    "approval-with-action",
                    &path.key(key),
                    format!("an approval stage runs nothing: it cannot have `{key}`{hint}"),
                );
                ok = false;
            }
        }
        if !spec.inputs.is_empty() {
            self.err_key(
                "approval-with-action",
                &path.key("inputs"),
                "an approval stage reads nothing: name the stages whose results people decide on in `needs` (their outputs and values are the evidence)",
            );
            ok = false;
        }
        if !spec.outputs.is_empty() {
            self.err_key(
                "approval-with-action",
                &path.key("outputs"),
                "an approval stage writes nothing: it cannot have `outputs` (its decision is in `stages.NAME.values`)",
            );
            ok = false;
        }
        let role = &a.approvers.role;
        if !is_ident(role) {
            self.err(
                "invalid-role",
                &ap.key("approvers").key("role"),
                format!("approval role `{role}` must start with a letter or `_` and hold only letters, digits, `_` and `-`"),
            );
            ok = false;
        }
        if a.approvers.min == 0 {
            self.err(
                "invalid-min",
                &ap.key("approvers").key("min"),
                "`min` is at least 1: someone decides",
            );
            ok = false;
        }
        let timeout = match &a.timeout {
            Some(t) => {
                let d = self.duration(&ap.key("timeout"), t);
                ok &= d.is_some();
                d
            }
            None => None,
        };
        ok.then(|| Action::Approval {
            role: role.clone(),
            min: a.approvers.min,
            timeout,
            on_timeout: a.on_timeout,
        })
    }

    /// A stage's environment: defaults, then the stage's, then `run.env`.
    fn stage_env(&mut self, sc: &mut StageCx<'_>) -> Vec<(String, Template)> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let mut env: Vec<(String, Template)> = Vec::new();
        let set_env = |env: &mut Vec<(String, Template)>, k: &str, t: Template| match env
            .iter_mut()
            .find(|(n, _)| n == k)
        {
            Some(slot) => slot.1 = t,
            None => env.push((k.to_owned(), t)),
        };
        for (k, v) in &sc.raw.defaults.env {
            if let Ok(t) = Template::parse(v) {
                set_env(&mut env, k, t);
            }
        }
        for (k, t) in std::mem::take(&mut sc.plugin_env) {
            set_env(&mut env, &k, t);
        }
        let run_env = spec.run.as_ref().map(|r| &r.env);
        let stage_env = spec.env.iter().map(|kv| (path.key("env"), kv));
        let run_env_iter = run_env
            .into_iter()
            .flatten()
            .map(|kv| (path.key("run").key("env"), kv));
        for (base, (k, v)) in stage_env.chain(run_env_iter).collect::<Vec<_>>() {
            let ep = base.key(k);
            self.env_name(&ep, k);
            if let Some(t) = self.stage_template(sc, &ep, v) {
                set_env(&mut env, k, t);
            }
        }
        env
    }

    /// A stage's inputs, each an edge from the stage whose output it reads.
    fn stage_inputs(&mut self, sc: &mut StageCx<'_>) -> Vec<Input> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let mut inputs = Vec::new();
        for (name, input) in &spec.inputs {
            let ip = path.key("inputs").key(name);
            if !is_ident(name) {
                self.err_key("invalid-input-name", &ip, format!(
                    "input name `{name}` must start with a letter or `_` and hold only letters, digits, `_` and `-`"
                ));
            }
            let target_path = match input {
                crate::spec::InputSpec::Short(_) => ip.clone(),
                crate::spec::InputSpec::Long(_) => ip.key("from"),
            };
            if let Some((stage, output)) =
                self.artifact_ref(sc, &target_path, input.from(), "input")
            {
                sc.edges.push((
                    stage,
                    EdgeKind::Input {
                        input: name.clone(),
                        output: output.clone(),
                    },
                    None,
                ));
                inputs.push(Input {
                    name: name.clone(),
                    stage,
                    output,
                    optional: input.optional(),
                    mode: input.mode(),
                });
            }
        }
        inputs
    }

    /// A stage's `needs`, each an edge.
    fn stage_needs(&mut self, sc: &mut StageCx<'_>) {
        let spec = sc.spec;
        let path = sc.path.clone();
        for (i, need) in spec.needs.iter().enumerate() {
            let np = path.key("needs").index(i);
            if need == sc.name {
                self.err("self-need", &np, format!("stage `{need}` needs itself"));
                continue;
            }
            match sc.index.get(need.as_str()) {
                Some(&id) => sc.edges.push((id, EdgeKind::Needs, None)),
                None => {
                    let hint = did_you_mean(need, sc.index.keys().copied());
                    self.err(
                        "unknown-stage",
                        &np,
                        format!("`needs` names unknown stage `{need}`"),
                    )
                    .maybe_hint(hint);
                }
            }
        }
    }

    /// A stage's `when` condition, parsed, with its references checked.
    fn stage_when(&mut self, sc: &mut StageCx<'_>) -> Option<(Expr, String)> {
        let spec = sc.spec;
        let path = sc.path.clone();
        spec.when.as_ref().and_then(|w| {
            let wp = path.key("when");
            match Expr::parse(w) {
                Ok(e) => {
                    for (r, range) in e.refs() {
                        self.check_ref(sc, &wp, r, range.clone(), RefSite::Condition);
                    }
                    Some((e, w.clone()))
                }
                Err(e) => {
                    self.err_in_string(
                        "invalid-condition",
                        &wp,
                        e.range,
                        format!("invalid `when` condition: {}", e.message),
                    );
                    None
                }
            }
        })
    }

    /// A stage's cache policy, over the defaults' one.
    fn stage_cache(&mut self, sc: &mut StageCx<'_>) -> CachePolicy {
        let spec = sc.spec;
        let path = sc.path.clone();
        let cache_spec = spec.cache.as_ref().or(sc.raw.defaults.cache.as_ref());
        let cache_key = match (&spec.cache, cache_spec) {
            (Some(c), _) => {
                let kp = path.key("cache").key("key");
                c.key
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| self.stage_template(sc, &kp.index(i), t))
                    .collect()
            }
            // The defaults' entries, checked where they are written.
            (None, Some(c)) => c
                .key
                .iter()
                .filter_map(|t| Template::parse(t).ok())
                .collect(),
            (None, None) => Vec::new(),
        };
        CachePolicy {
            key: cache_key,
            enabled: cache_spec.is_none_or(|c| c.enabled),
            max_age: match spec.cache.as_ref().and_then(|c| c.max_age.as_ref()) {
                Some(m) => self.duration(&path.key("cache").key("max_age"), m),
                None => cache_spec
                    .and_then(|c| c.max_age.as_deref())
                    .and_then(|m| parse_duration(m).ok()),
            },
        }
    }

    /// A stage's resources, each unset one taken from the defaults.
    fn stage_resources(&mut self, sc: &StageCx<'_>) -> Resources {
        let spec = sc.spec;
        let path = sc.path.clone();
        match &spec.resources {
            Some(r) => {
                let mut own = self.resources(&path.key("resources"), r);
                if let Some(d) = &sc.raw.defaults.resources {
                    let base = self.quietly(|cx| cx.resources(&p("defaults").key("resources"), d));
                    own.cpu = own.cpu.or(base.cpu);
                    own.memory = own.memory.or(base.memory);
                    own.gpu = own.gpu.or(base.gpu);
                    own.shm = own.shm.or(base.shm);
                    own.ephemeral_storage = own.ephemeral_storage.or(base.ephemeral_storage);
                }
                own
            }
            None => match &sc.raw.defaults.resources {
                Some(d) => self.quietly(|cx| cx.resources(&p("defaults").key("resources"), d)),
                None => Resources::default(),
            },
        }
    }

    /// A stage's `distributed` ranks.
    fn stage_distributed(&mut self, sc: &StageCx<'_>) -> Option<Distributed> {
        let spec = sc.spec;
        let path = sc.path.clone();
        spec.distributed.as_ref().and_then(|d| {
            let dp = path.key("distributed");
            let mut ok = true;
            if d.workers < 1 {
                self.err(
                    "invalid-workers",
                    &dp.key("workers"),
                    format!(
                        "`workers: {}`; a distributed stage has at least 1 worker",
                        d.workers
                    ),
                );
                ok = false;
            }
            let slots = d.slots_per_worker.unwrap_or(1);
            if slots < 1 {
                self.err(
                    "invalid-workers",
                    &dp.key("slots_per_worker"),
                    format!("`slots_per_worker: {slots}`; each worker has at least 1 slot"),
                );
                ok = false;
            }
            if d.slots_per_worker.is_some() && d.framework != crate::spec::Framework::Mpi {
                self.diags.push(
                    Diagnostic::warning(
                        "unused-field",
                        "`slots_per_worker` only applies to `framework: mpi`",
                    )
                    .path(dp.key("slots_per_worker")),
                );
            }
            if spec.map.is_some() {
                self.err_key(
                    "map-and-distributed",
                    &dp,
                    "a stage cannot both fan out with `map` and run `distributed` ranks",
                )
                .hint("split it into a map stage and a distributed stage");
                ok = false;
            }
            ok.then(|| Distributed {
                framework: d.framework,
                workers: d.workers.clamp(1, u32::MAX as i64) as u32,
                slots_per_worker: slots.clamp(1, u32::MAX as i64) as u32,
            })
        })
    }

    /// A stage's volumes and the one its `snapshot` names.
    fn stage_volumes(&mut self, sc: &mut StageCx<'_>) {
        let spec = sc.spec;
        let path = sc.path.clone();
        let mut volume_names = HashSet::new();
        for (i, v) in spec.volumes.iter().enumerate() {
            let vp = path.key("volumes").index(i);
            if let Err(why) = dns1123_label(&v.name) {
                self.err(
                    "invalid-volume",
                    &vp.key("name"),
                    format!("volume name `{}` {why}", v.name),
                );
            }
            if !volume_names.insert(v.name.as_str()) {
                self.err(
                    "invalid-volume",
                    &vp.key("name"),
                    format!("volume `{}` is declared twice", v.name),
                );
            }
            if !v.mount_path.starts_with('/') {
                self.err(
                    "invalid-volume",
                    &vp.key("mount_path"),
                    format!("`mount_path` must be absolute, got `{}`", v.mount_path),
                );
            }
            if let Some(h) = v.host_path.as_deref().filter(|h| !h.starts_with('/')) {
                self.err(
                    "invalid-volume",
                    &vp.key("host_path"),
                    format!("`host_path` must be absolute, got `{h}`"),
                );
            }
            let sources = [
                v.claim.is_some(),
                v.empty_dir.is_some(),
                v.from_snapshot.is_some(),
                v.host_path.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if sources != 1 {
                self.err(
                    "invalid-volume",
                    &vp,
                    format!(
                        "volume `{}` needs exactly one of `claim`, `empty_dir`, `from_snapshot` and `host_path`",
                        v.name
                    ),
                );
            }
            if let Some(q) = &v.empty_dir {
                self.quantity(&vp.key("empty_dir"), q);
            }
            if let Some(name) = &v.from_snapshot {
                // `{{ stages.X.values.snapshot.name }}`: a snapshot an upstream stage took.
                let _ = self.stage_template(sc, &vp.key("from_snapshot"), name);
            }
            match (&v.from_snapshot, &v.size) {
                (Some(_), Some(q)) => {
                    self.quantity(&vp.key("size"), q);
                }
                (Some(_), None) => {
                    self.err(
                        "invalid-volume",
                        &vp,
                        format!(
                            "volume `{}` is restored from a snapshot and needs `size` (at least the snapshot's size)",
                            v.name
                        ),
                    );
                }
                (None, Some(_)) => {
                    self.err(
                        "invalid-volume",
                        &vp.key("size"),
                        format!("`size` is for volumes restored with `from_snapshot`; volume `{}` is not", v.name),
                    );
                }
                (None, None) => {}
            }
        }
        if let Some(s) = &spec.snapshot {
            if !volume_names.contains(s.volume.as_str()) {
                let hint = did_you_mean(&s.volume, volume_names.iter().copied());
                self.err(
                    "unknown-volume",
                    &path.key("snapshot").key("volume"),
                    format!(
                        "`snapshot` names volume `{}`, which this stage does not mount",
                        s.volume
                    ),
                )
                .maybe_hint(hint);
            }
        }
    }

    /// A stage's secrets and tolerations.
    fn stage_secrets(&mut self, sc: &StageCx<'_>) {
        let spec = sc.spec;
        let path = sc.path.clone();
        for (i, s) in spec.secrets.iter().enumerate() {
            let sp = path.key("secrets").index(i);
            match (&s.env, &s.mount_path) {
                (Some(_), Some(_)) | (None, None) => {
                    self.err("invalid-secret", &sp, format!(
                        "secret `{}` needs exactly one of `env` (one key as a variable) and `mount_path` (files)",
                        s.name
                    ));
                }
                (Some(var), None) => {
                    self.env_name(&sp.key("env"), var);
                    if s.key.is_none() {
                        self.err(
                            "invalid-secret",
                            &sp,
                            format!(
                                "secret `{}` exposed as `{var}` needs the `key` to read",
                                s.name
                            ),
                        );
                    }
                }
                (None, Some(m)) if !m.starts_with('/') => {
                    self.err(
                        "invalid-secret",
                        &sp.key("mount_path"),
                        format!("`mount_path` must be absolute, got `{m}`"),
                    );
                }
                _ => {}
            }
        }
        for (i, t) in spec.tolerations.iter().enumerate() {
            if t.operator == TolerationOperator::Exists && t.value.is_some() {
                self.err(
                    "invalid-toleration",
                    &path.key("tolerations").index(i).key("value"),
                    "a toleration with `operator: Exists` takes no `value`",
                );
            }
        }
    }

    /// A stage's image, which a container executor needs.
    fn stage_image(&mut self, sc: &StageCx<'_>, executor: &str) -> Option<Template> {
        let spec = sc.spec;
        let path = sc.path.clone();
        let image = match spec.run.as_ref().and_then(|r| r.image.as_ref()) {
            Some(i) => Template::parse(i).ok(),
            None => sc
                .raw
                .defaults
                .image
                .as_deref()
                .and_then(|i| Template::parse(i).ok()),
        };
        if executor == "kubernetes" && image.is_none() {
            self.err_key(
                "missing-image",
                &path,
                format!(
                "stage `{}` has no image; the kubernetes executor runs every stage in a container",
                sc.name
            ),
            )
            .hint("set `run.image` or `defaults.image`");
        }
        image
    }
}

//! Checks of `triggers:` and `notify:`, into [`Trigger`]s and [`Sink`]s.

use std::collections::BTreeMap;

use super::{dns1123_label, p, Annotate, Cx, Raw};
use crate::diag::did_you_mean;
use crate::events::{
    After, Hook, Objects, Secret, Sink, SinkKind, Text, Trigger, Watch, OBJECT_VALUES,
    TRIGGER_VALUES,
};
use crate::plan::Param;
use crate::spec::{NotifyEvent, NotifySpec, ObjectsSpec, TriggerSpec};
use crate::state::Phase;
use crate::yaml::YamlPath;

const SOURCE_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "file"];

/// A file of server-wide notification sinks (`drivetrain serve --notify FILE`): a
/// `notify:` list shaped as a pipeline's, its problems located as a pipeline's are. Its
/// sinks are named `defaults[N]`, apart from a pipeline's `notify[N]`.
pub fn notify_file(src: &str) -> Result<Vec<Sink>, Vec<crate::diag::Diagnostic>> {
    let root = crate::yaml::parse(src)?;
    let catalog = crate::step::Catalog::new(Vec::new(), Vec::new());
    let mut cx = Cx {
        src,
        tree: None,
        catalog: &catalog,
        diags: Vec::new(),
        with_nodes: Vec::new(),
        in_string: std::collections::HashMap::new(),
        plugins: crate::plugin::Resolver::new(crate::plugin::Origin::default()),
    };
    let specs = match root
        .as_map()
        .and_then(|m| m.iter().find(|e| e.key == "notify"))
    {
        Some(e) => crate::de::from_node::<Vec<NotifySpec>>(&e.value, &p("notify"), &mut cx.diags),
        None => {
            cx.err(
                "missing-field",
                &YamlPath::root(),
                "a notifications file is a mapping with `notify:`, a list shaped as a pipeline's",
            );
            None
        }
    };
    let sinks = specs.and_then(|specs| cx.check_notify(&specs));
    let diagnostics = cx.located();
    match sinks {
        Some(sinks) if !diagnostics.iter().any(crate::diag::Diagnostic::is_error) => Ok(sinks
            .into_iter()
            .map(|mut s| {
                s.name = s.name.replacen("notify", "defaults", 1);
                s
            })
            .collect()),
        _ => Err(diagnostics),
    }
}

impl Cx<'_> {
    /// Every trigger, or `None` if one is invalid (reported).
    pub(super) fn check_triggers(
        &mut self,
        raw: &Raw,
        params: &[Param],
    ) -> Option<BTreeMap<String, Trigger>> {
        let mut out = BTreeMap::new();
        let mut ok = true;
        for (name, spec) in &raw.triggers {
            let tp = p("triggers").key(name);
            if let Err(why) = dns1123_label(name) {
                self.err_key("invalid-name", &tp, format!("trigger name `{name}` {why}"));
                ok = false;
            }
            let Some(spec) = spec else {
                ok = false;
                continue;
            };
            match self.check_trigger(name, &tp, spec, params) {
                Some(t) => {
                    out.insert(name.clone(), t);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn check_trigger(
        &mut self,
        name: &str,
        tp: &YamlPath,
        spec: &TriggerSpec,
        params: &[Param],
    ) -> Option<Trigger> {
        let mut ok = true;
        let watch = self.trigger_watch(name, tp, spec);
        if let Some(a) = &spec.after {
            if a.phase.contains(&crate::spec::NotifyEvent::Started) {
                self.err(
                    "invalid-trigger",
                    &tp.key("after").key("phase"),
                    "`after` counts runs that ended: succeeded, failed, error or cancelled",
                );
                ok = false;
            }
            if let Err(why) = dns1123_label(&a.pipeline) {
                self.err(
                    "invalid-name",
                    &tp.key("after").key("pipeline"),
                    format!("pipeline name `{}` {why}", a.pipeline),
                );
                ok = false;
            }
        }
        let bp = tp.key("batch");
        let b = spec.batch.clone().unwrap_or(crate::spec::BatchSpec {
            min_items: None,
            max_items: None,
            max_wait: None,
            group_by: None,
        });
        let min_items = b.min_items.unwrap_or(1).max(1) as usize;
        let default_max = match &spec.after {
            Some(_) => 1,
            None => 1000,
        };
        let max_items = b.max_items.unwrap_or(default_max) as usize;
        if max_items == 0 || max_items < min_items {
            self.err(
                "invalid-batch",
                &bp.key("max_items"),
                format!("`max_items` ({max_items}) is below `min_items` ({min_items})"),
            );
            ok = false;
        }
        let max_wait = match &b.max_wait {
            Some(t) => {
                let d = self.duration(&bp.key("max_wait"), t);
                ok &= d.is_some();
                d
            }
            None => None,
        };
        let group_by = match &b.group_by {
            None => None,
            Some(g) => match Text::parse(g, OBJECT_VALUES) {
                Ok(t) => Some(t),
                Err(e) => {
                    self.err("invalid-template", &bp.key("group_by"), e.to_string());
                    ok = false;
                    None
                }
            },
        };
        let mut tparams = BTreeMap::new();
        for (param, text) in &spec.params {
            let pp = tp.key("params").key(param);
            if !params.iter().any(|x| &x.name == param) {
                let known = params.iter().map(|x| x.name.as_str());
                self.err_key(
                    "unknown-param",
                    &pp,
                    format!(
                        "trigger `{name}` sets `{param}`, which is not a param of this pipeline"
                    ),
                )
                .maybe_hint(did_you_mean(param, known));
                ok = false;
                continue;
            }
            match Text::parse(text, TRIGGER_VALUES) {
                Ok(t) => {
                    tparams.insert(param.clone(), t);
                }
                Err(e) => {
                    self.err("invalid-template", &pp, e.to_string());
                    ok = false;
                }
            }
        }
        Some(Trigger {
            name: name.to_owned(),
            watch: watch?,
            min_items,
            max_items,
            max_wait,
            group_by,
            params: tparams,
            paused: spec.paused,
        })
        .filter(|_| ok)
    }

    /// What trigger `name` watches: objects, another pipeline's runs, or webhook calls
    /// (exactly one).
    fn trigger_watch(&mut self, name: &str, tp: &YamlPath, spec: &TriggerSpec) -> Option<Watch> {
        match (&spec.objects, &spec.after, &spec.webhook) {
            (Some(o), None, None) => self
                .check_objects(&tp.key("objects"), o)
                .map(Watch::Objects),
            (None, None, Some(w)) => match (&w.secret_env, &w.secret_file) {
                (Some(e), None) => Some(Watch::Webhook(Hook {
                    secret: Secret::Env(e.clone()),
                })),
                (None, Some(f)) => Some(Watch::Webhook(Hook {
                    secret: Secret::File(f.clone()),
                })),
                _ => {
                    self.err(
                    "invalid-secret",
                    &tp.key("webhook"),
                    "a webhook trigger's calls are signed: name its secret with `secret_env` or `secret_file` (one of them)",
                );
                    None
                }
            },
            (None, Some(a), None) => Some(Watch::After(After {
                pipeline: a.pipeline.clone(),
                phases: match a.phase.is_empty() {
                    true => vec![Phase::Succeeded],
                    false => a.phase.iter().filter_map(|e| e.phase()).collect(),
                },
            })),
            _ => {
                self.err(
                    "invalid-trigger",
                    tp,
                    format!(
                        "trigger `{name}` watches `objects`, `after` or `webhook` (one of them)"
                    ),
                );
                None
            }
        }
    }

    fn check_objects(&mut self, op: &YamlPath, o: &ObjectsSpec) -> Option<Objects> {
        let mut ok = true;
        // A folder's path (relative to the pipeline's folder, or absolute): no URL to check.
        let folder = Objects::is_path(&o.source) && !o.source.is_empty();
        match url::Url::parse(&o.source) {
            _ if folder => {}
            Ok(u) if SOURCE_SCHEMES.contains(&u.scheme()) => {
                if u.scheme() == "file" && !u.path().starts_with('/') {
                    self.err(
                        "invalid-source",
                        &op.key("source"),
                        "a `file://` source is an absolute path",
                    );
                    ok = false;
                }
            }
            Ok(u) => {
                let scheme = u.scheme().to_owned();
                self.err(
                    "invalid-source",
                    &op.key("source"),
                    format!("objects cannot be discovered under `{scheme}://`; use s3://, gs://, az:// or file://"),
                )
                .maybe_hint(did_you_mean(&scheme, SOURCE_SCHEMES.iter().copied()));
                ok = false;
            }
            Err(e) => {
                self.err(
                    "invalid-source",
                    &op.key("source"),
                    format!("`{}` is not a URL: {e}", o.source),
                )
                .hint("e.g. `s3://fleet/incoming/`, `file:///data/incoming/` or a folder beside the pipeline, `landing/`");
                ok = false;
            }
        }
        let matcher = match &o.pattern {
            None => None,
            Some(g) => match globset::GlobBuilder::new(g).literal_separator(true).build() {
                Ok(g) => Some(g.compile_matcher()),
                Err(e) => {
                    self.err("invalid-glob", &op.key("match"), format!("`{g}`: {e}"));
                    ok = false;
                    None
                }
            },
        };
        if let Some(q) = &o.queue {
            if !q.starts_with("http://") && !q.starts_with("https://") {
                self.err(
                    "invalid-queue",
                    &op.key("queue"),
                    format!("`{q}` is not an SQS queue URL (`https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`)"),
                );
                ok = false;
            }
        }
        let poll = self.duration_or(&op.key("poll"), o.poll.as_deref(), 10);
        let rescan = self.duration_or(&op.key("rescan"), o.rescan.as_deref(), 600);
        Some(Objects {
            source: o.source.clone(),
            matcher,
            queue: o.queue.clone(),
            poll: poll?,
            rescan: rescan?,
        })
        .filter(|_| ok)
    }

    fn duration_or(
        &mut self,
        path: &YamlPath,
        text: Option<&str>,
        default_s: u64,
    ) -> Option<std::time::Duration> {
        match text {
            Some(t) => self.duration(path, t),
            None => Some(std::time::Duration::from_secs(default_s)),
        }
    }

    /// Every sink, or `None` if one is invalid (reported).
    pub(super) fn check_notify(&mut self, specs: &[NotifySpec]) -> Option<Vec<Sink>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (i, s) in specs.iter().enumerate() {
            let np = p("notify").index(i);
            let secret = |env: &Option<String>, file: &Option<String>| match (env, file) {
                (Some(e), None) => Some(Secret::Env(e.clone())),
                (None, Some(f)) => Some(Secret::File(f.clone())),
                _ => None,
            };
            let mut kinds = Vec::new();
            if let Some(w) = &s.webhook {
                match url::Url::parse(&w.url) {
                    Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                    _ => {
                        self.err(
                            "invalid-url",
                            &np.key("webhook").key("url"),
                            format!("`{}` is not an http:// or https:// URL", w.url),
                        );
                        ok = false;
                    }
                }
                if w.secret_env.is_some() && w.secret_file.is_some() {
                    self.err(
                        "invalid-secret",
                        &np.key("webhook"),
                        "give `secret_env` or `secret_file`, not both",
                    );
                    ok = false;
                }
                kinds.push(SinkKind::Webhook {
                    url: w.url.clone(),
                    secret: secret(&w.secret_env, &w.secret_file),
                });
            }
            if let Some(sl) = &s.slack {
                match secret(&sl.url_env, &sl.url_file) {
                    Some(url) => kinds.push(SinkKind::Slack { url }),
                    None => {
                        self.err(
                            "invalid-secret",
                            &np.key("slack"),
                            "a Slack webhook's URL is a secret: name it with `url_env` or `url_file` (one of them)",
                        );
                        ok = false;
                    }
                }
            }
            if let Some(e) = &s.email {
                match url::Url::parse(&e.smtp) {
                    Ok(u) if u.scheme() == "smtp" && u.host_str().is_some() => {}
                    _ => {
                        self.err(
                            "invalid-url",
                            &np.key("email").key("smtp"),
                            format!("`{}` is not an `smtp://host:port` URL", e.smtp),
                        );
                        ok = false;
                    }
                }
                if e.to.is_empty() {
                    self.err("invalid-email", &np.key("email").key("to"), "no recipient");
                    ok = false;
                }
                kinds.push(SinkKind::Email {
                    smtp: e.smtp.clone(),
                    from: e.from.clone(),
                    to: e.to.clone(),
                    auth: e.auth_env.clone().map(Secret::Env),
                });
            }
            let given = [s.webhook.is_some(), s.slack.is_some(), s.email.is_some()];
            if given.iter().filter(|g| **g).count() != 1 {
                self.err(
                    "invalid-sink",
                    &np,
                    "each `notify` entry has one of `webhook`, `slack` or `email`",
                );
                ok = false;
                continue;
            }
            if kinds.len() != 1 {
                continue;
            }
            let mut on = s.on.clone();
            if on.is_empty() {
                on = NotifyEvent::ENDS.to_vec();
                on.push(NotifyEvent::Deadline);
                on.push(NotifyEvent::Waiting);
            }
            out.push(Sink {
                name: format!("notify[{i}]"),
                on,
                to: kinds.remove(0),
            });
        }
        ok.then_some(out)
    }
}

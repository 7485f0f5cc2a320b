//! A stage's `scheduling:` (queue, priority, preemption, topology) over
//! `defaults.scheduling`, field by field, each problem located where it was written.

use crate::diag::Diagnostic;
use crate::plan::{Priority, Scheduling, Topology};
use crate::spec::{PrioritySpec, SchedulingSpec, TopologySpec};
use crate::yaml::YamlPath;

use super::{dns1123_label, dns_hint, p, Annotate, Cx, StageCx};

/// The bound on a priority either way (Kubernetes' user-defined `PriorityClass`es stop
/// at 10^9; a local queue needs far less, and a bound keeps sums and orders exact).
pub const MAX_PRIORITY: i64 = 1_000_000;

impl Cx<'_> {
    /// The stage's scheduling: its own fields, then the defaults', then [`Scheduling`]'s.
    /// `gpus`: whether the stage claims any (preemption only ever frees GPUs); `executor`:
    /// where it runs (a cluster orders by class names, not numbers).
    pub(super) fn stage_scheduling(
        &mut self,
        sc: &StageCx<'_>,
        gpus: bool,
        executor: &str,
    ) -> Scheduling {
        let mut out = Scheduling::default();
        // The defaults first, reported once (at `defaults.scheduling`) however many
        // stages take them, then the stage's own over them.
        if let Some(d) = &sc.raw.defaults.scheduling {
            let at = p("defaults").key("scheduling");
            self.quietly(|cx| cx.apply_scheduling(&at, d, &mut out));
        }
        if let Some(own) = &sc.spec.scheduling {
            let at = sc.path.key("scheduling");
            self.apply_scheduling(&at, own, &mut out);
            if executor == "kubernetes"
                && matches!(own.priority, Some(PrioritySpec::Value(v)) if v != 0)
            {
                self.diags.push(
                    Diagnostic::warning(
                        "unused-field",
                        "a number orders only this home's queue for GPUs; on Kubernetes the cluster orders by class: name one (`priority: urgent`, a Kueue WorkloadPriorityClass or a PriorityClass)",
                    )
                    .path(at.key("priority")),
                );
            }
            if own.preemptible == Some(true) && !gpus {
                self.diags.push(
                    Diagnostic::warning(
                        "unused-field",
                        "`preemptible` has no effect here: preemption frees GPUs, and this stage asks for none (`resources.gpu`)",
                    )
                    .path(at.key("preemptible")),
                );
            }
        }
        out
    }

    /// Checks the pipeline's `defaults.scheduling` (reported there, once).
    pub(super) fn defaults_scheduling(&mut self, spec: &SchedulingSpec) {
        let mut out = Scheduling::default();
        self.apply_scheduling(&p("defaults").key("scheduling"), spec, &mut out);
    }

    fn apply_scheduling(&mut self, at: &YamlPath, spec: &SchedulingSpec, out: &mut Scheduling) {
        if let Some(q) = &spec.queue {
            if self.label(&at.key("queue"), "invalid-queue", "queue name", q) {
                out.queue = Some(q.clone());
            }
        }
        match &spec.priority {
            Some(PrioritySpec::Value(pr)) if pr.abs() > MAX_PRIORITY => {
                self.err(
                    "invalid-priority",
                    &at.key("priority"),
                    format!(
                        "priority {pr} is out of bounds: from -{MAX_PRIORITY} to {MAX_PRIORITY}"
                    ),
                );
            }
            Some(PrioritySpec::Value(pr)) => out.priority = Priority::Value(*pr),
            Some(PrioritySpec::Class(c))
                if self.label(
                    &at.key("priority"),
                    "invalid-priority",
                    "priority class name",
                    c,
                ) =>
            {
                out.priority = Priority::Class(c.clone());
            }
            Some(PrioritySpec::Class(_)) | None => {}
        }
        if let Some(b) = spec.preemptible {
            out.preemptible = b;
        }
        if let Some(g) = &spec.grace {
            if let Some(d) = self.duration(&at.key("grace"), g) {
                out.grace = d;
            }
        }
        if let Some(t) = &spec.topology {
            out.topology = self.topology(&at.key("topology"), t);
        }
    }

    /// A name that must be a DNS label (it names a cluster's object); whether it is one.
    fn label(&mut self, at: &YamlPath, code: &'static str, what: &str, name: &str) -> bool {
        match dns1123_label(name) {
            Ok(()) => true,
            Err(why) => {
                self.err(code, at, format!("{what} `{name}` {why}"))
                    .maybe_hint(dns_hint(name));
                false
            }
        }
    }

    fn topology(&mut self, at: &YamlPath, t: &TopologySpec) -> Option<Topology> {
        let (level, required) = match (&t.require, &t.prefer) {
            (Some(l), None) => (l, true),
            (None, Some(l)) => (l, false),
            _ => {
                self.err(
                    "invalid-topology",
                    at,
                    "`topology` holds exactly one of `require` and `prefer` (a level: `rack`, `cloud.provider.com/topology-block`)",
                );
                return None;
            }
        };
        let bad = level.is_empty() || level.len() > 253 || level.chars().any(char::is_whitespace);
        if bad {
            let key = if required { "require" } else { "prefer" };
            self.err(
                "invalid-topology",
                &at.key(key),
                format!("topology level `{level}` must be a node label's key or a tier's name: 1 to 253 characters, no spaces"),
            );
            return None;
        }
        Some(Topology {
            level: level.clone(),
            required,
        })
    }
}

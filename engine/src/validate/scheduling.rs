//! A stage's `scheduling:` (queue, priority, preemption) over `defaults.scheduling`,
//! field by field, each problem located where it was written.

use crate::diag::Diagnostic;
use crate::plan::Scheduling;
use crate::spec::SchedulingSpec;
use crate::yaml::YamlPath;

use super::{dns1123_label, dns_hint, p, Annotate, Cx, StageCx};

/// The bound on a priority either way (Kubernetes' user-defined `PriorityClass`es stop
/// at 10^9; a local queue needs far less, and a bound keeps sums and orders exact).
pub const MAX_PRIORITY: i64 = 1_000_000;

impl Cx<'_> {
    /// The stage's scheduling: its own fields, then the defaults', then [`Scheduling`]'s.
    /// `gpus`: whether the stage claims any (preemption only ever frees GPUs).
    pub(super) fn stage_scheduling(&mut self, sc: &StageCx<'_>, gpus: bool) -> Scheduling {
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
            match dns1123_label(q) {
                Ok(()) => out.queue = q.clone(),
                Err(why) => {
                    self.err(
                        "invalid-queue",
                        &at.key("queue"),
                        format!("queue name `{q}` {why}"),
                    )
                    .maybe_hint(dns_hint(q));
                }
            }
        }
        if let Some(pr) = spec.priority {
            if pr.abs() > MAX_PRIORITY {
                self.err(
                    "invalid-priority",
                    &at.key("priority"),
                    format!(
                        "priority {pr} is out of bounds: from -{MAX_PRIORITY} to {MAX_PRIORITY}"
                    ),
                );
            } else {
                out.priority = pr;
            }
        }
        if let Some(b) = spec.preemptible {
            out.preemptible = b;
        }
        if let Some(g) = &spec.grace {
            if let Some(d) = self.duration(&at.key("grace"), g) {
                out.grace = d;
            }
        }
    }
}

//! The run's DAG state, synchronous: which stages wait for how many upstream stages,
//! which are ready (in the plan's order), and what each ended one left for its
//! dependants. The async driver ([`super::run`]) takes the next ready stage, and tells the
//! `Dag` how each stage ended; the `Dag` answers by making its dependants ready once their
//! last upstream stage has ended. Whether a ready stage can run at all follows from what
//! its upstream stages left ([`Dag::blocked`]). No I/O, no clock, no executor: the tests
//! below drive it directly.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::artifacts::ArtifactRef;
use crate::plan::{Pipeline, Stage, StageId};
use crate::state::Phase;

/// What a finished stage leaves for its dependants.
#[derive(Debug, Clone)]
pub(super) struct StageResult {
    pub(super) phase: Phase,
    pub(super) outputs: BTreeMap<String, ArtifactRef>,
    pub(super) values: Value,
}

impl StageResult {
    /// A stage that ended without running (skipped, omitted): nothing for its dependants.
    pub(super) fn empty(phase: Phase) -> StageResult {
        StageResult {
            phase,
            outputs: BTreeMap::new(),
            values: Value::Null,
        }
    }
}

pub(super) struct Dag {
    /// Each stage's position in the plan's order: ready stages are taken in that order.
    rank: Vec<usize>,
    /// Upstream stages not ended yet, per stage.
    waiting: Vec<usize>,
    ready: BTreeSet<(usize, StageId)>,
    results: Vec<Option<StageResult>>,
}

impl Dag {
    /// Every stage waiting for its upstream stages; those with none ready, hooks aside
    /// (they run after the rest).
    pub(super) fn new(pipeline: &Pipeline) -> Dag {
        let n = pipeline.stages.len();
        let mut rank = vec![0usize; n];
        for (i, id) in pipeline.order.iter().enumerate() {
            rank[id.index()] = i;
        }
        let waiting: Vec<usize> = (0..n)
            .map(|i| pipeline.upstream(StageId(i as u32)).len())
            .collect();
        let ready = pipeline
            .order
            .iter()
            .copied()
            .filter(|id| waiting[id.index()] == 0 && pipeline.stage(*id).hook.is_none())
            .map(|id| (rank[id.index()], id))
            .collect();
        Dag {
            rank,
            waiting,
            ready,
            results: vec![None; n],
        }
    }

    /// The first ready stage in plan order, taken.
    pub(super) fn next_ready(&mut self) -> Option<StageId> {
        self.ready.pop_first().map(|(_, id)| id)
    }

    /// Stage `id` ended with `result`: a dependant whose last upstream stage this was
    /// becomes ready. A stage that ends before its turn (a resumed run's, a reused one) is
    /// no longer ready either; a hook's end makes nothing ready.
    pub(super) fn end(&mut self, pipeline: &Pipeline, id: StageId, result: StageResult) {
        self.ready.remove(&(self.rank[id.index()], id));
        self.results[id.index()] = Some(result);
        if pipeline.stage(id).hook.is_some() {
            return;
        }
        for d in pipeline.downstream(id) {
            // Hooks run after the rest; a stage a rerun reused ended before its upstream did.
            if pipeline.stage(d).hook.is_some() || self.results[d.index()].is_some() {
                continue;
            }
            self.waiting[d.index()] -= 1;
            if self.waiting[d.index()] == 0 {
                self.ready.insert((self.rank[d.index()], d));
            }
        }
    }

    /// How stage `id` ended, if it has.
    pub(super) fn result(&self, id: StageId) -> Option<&StageResult> {
        self.results[id.index()].as_ref()
    }

    /// What the upstream stages of `id` that have ended left.
    pub(super) fn upstream(
        &self,
        pipeline: &Pipeline,
        id: StageId,
    ) -> BTreeMap<StageId, StageResult> {
        pipeline
            .upstream(id)
            .into_iter()
            .filter_map(|u| self.result(u).cloned().map(|r| (u, r)))
            .collect()
    }

    /// Why ready stage `id` cannot run, from how its upstream stages ended: `Omitted` when
    /// one did not succeed, `Skipped` when the producer of a required input was skipped.
    pub(super) fn blocked(&self, pipeline: &Pipeline, id: StageId) -> Option<(Phase, String)> {
        for u in pipeline.upstream(id) {
            let phase = self.result(u).map(|r| r.phase).unwrap_or(Phase::Omitted);
            if matches!(
                phase,
                Phase::Failed | Phase::Error | Phase::Omitted | Phase::Cancelled
            ) {
                return Some((
                    Phase::Omitted,
                    format!("`{}` did not succeed ({phase})", pipeline.stage(u).name),
                ));
            }
        }
        for input in &pipeline.stage(id).inputs {
            let phase = self.result(input.stage).map(|r| r.phase);
            if phase == Some(Phase::Skipped) && !input.optional {
                return Some((
                    Phase::Skipped,
                    format!(
                        "input `{}` comes from `{}`, which was skipped",
                        input.name,
                        pipeline.stage(input.stage).name
                    ),
                ));
            }
        }
        None
    }

    /// The phase of each stage; one that never ended was `Omitted`.
    pub(super) fn phases(&self, pipeline: &Pipeline) -> BTreeMap<crate::names::StageName, Phase> {
        pipeline
            .stages
            .iter()
            .map(|s| (s.name.clone(), self.phase_of(s.id)))
            .collect()
    }

    fn phase_of(&self, id: StageId) -> Phase {
        self.result(id).map(|r| r.phase).unwrap_or(Phase::Omitted)
    }

    /// The phase of the run over the stages `counted` selects: `Cancelled` when it was,
    /// `Succeeded` when each succeeded or was skipped, `Error` when one ended so, else
    /// `Failed`.
    pub(super) fn run_phase(
        &self,
        pipeline: &Pipeline,
        cancelled: bool,
        counted: impl Fn(&Stage) -> bool,
    ) -> Phase {
        let phases: Vec<Phase> = pipeline
            .stages
            .iter()
            .filter(|s| counted(s))
            .map(|s| self.phase_of(s.id))
            .collect();
        if cancelled {
            Phase::Cancelled
        } else if phases
            .iter()
            .all(|p| matches!(p, Phase::Succeeded | Phase::Skipped))
        {
            Phase::Succeeded
        } else if phases.contains(&Phase::Error) {
            Phase::Error
        } else {
            Phase::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::Catalog;

    fn pipeline(stages: &str) -> Pipeline {
        let yaml = format!("version: 1\nname: dag\nstages:\n{stages}");
        let v = crate::validate(&yaml, &Catalog::new(Vec::new(), vec!["local"]));
        v.pipeline.unwrap_or_else(|| panic!("{:?}", v.diagnostics))
    }

    fn id(p: &Pipeline, name: &str) -> StageId {
        p.stage_by_name(name).unwrap().id
    }

    fn names(p: &Pipeline, dag: &mut Dag) -> Vec<String> {
        std::iter::from_fn(|| dag.next_ready())
            .map(|i| p.stage(i).name.to_string())
            .collect()
    }

    /// a → b, a → c, (b, c) → d; a hook `h`.
    fn diamond() -> Pipeline {
        pipeline(
            "  a:\n    run: {command: [x]}\n    outputs: [o]\n  b:\n    needs: [a]\n    run: {command: [x]}\n  c:\n    inputs: {o: a.o}\n    run: {command: [x]}\n  d:\n    needs: [b, c]\n    run: {command: [x]}\n  h:\n    hook: finally\n    run: {command: [x]}\n",
        )
    }

    #[test]
    fn roots_are_ready_and_a_stage_waits_for_all_its_upstream_stages() {
        let p = diamond();
        let mut dag = Dag::new(&p);
        assert_eq!(
            names(&p, &mut dag),
            ["a"],
            "hooks are not ready with the roots"
        );
        dag.end(&p, id(&p, "a"), StageResult::empty(Phase::Succeeded));
        assert_eq!(names(&p, &mut dag), ["b", "c"], "in plan order");
        dag.end(&p, id(&p, "b"), StageResult::empty(Phase::Succeeded));
        assert_eq!(
            names(&p, &mut dag),
            Vec::<String>::new(),
            "d still waits for c"
        );
        dag.end(&p, id(&p, "c"), StageResult::empty(Phase::Succeeded));
        assert_eq!(names(&p, &mut dag), ["d"]);
        dag.end(&p, id(&p, "d"), StageResult::empty(Phase::Succeeded));
        assert_eq!(
            names(&p, &mut dag),
            Vec::<String>::new(),
            "the hook is the driver's"
        );
        assert_eq!(
            dag.run_phase(&p, false, |s| s.hook.is_none()),
            Phase::Succeeded
        );
        assert_eq!(dag.phases(&p)["h"], Phase::Omitted, "not ended yet");
        dag.end(&p, id(&p, "h"), StageResult::empty(Phase::Succeeded));
        assert_eq!(dag.run_phase(&p, false, |_| true), Phase::Succeeded);
    }

    #[test]
    fn a_failed_or_omitted_upstream_stage_omits_and_a_skipped_producer_skips() {
        let p = diamond();
        let mut dag = Dag::new(&p);
        dag.end(&p, id(&p, "a"), StageResult::empty(Phase::Skipped));
        // `b` only needs `a`: a skipped stage is done. `c` reads `a`'s output.
        assert_eq!(dag.blocked(&p, id(&p, "b")), None);
        let (phase, why) = dag.blocked(&p, id(&p, "c")).unwrap();
        assert_eq!(phase, Phase::Skipped);
        assert_eq!(why, "input `o` comes from `a`, which was skipped");
        dag.end(&p, id(&p, "b"), StageResult::empty(Phase::Failed));
        dag.end(&p, id(&p, "c"), StageResult::empty(Phase::Skipped));
        let (phase, why) = dag.blocked(&p, id(&p, "d")).unwrap();
        assert_eq!(phase, Phase::Omitted);
        assert_eq!(why, "`b` did not succeed (Failed)");
        for upstream in [Phase::Error, Phase::Omitted, Phase::Cancelled] {
            let mut dag = Dag::new(&p);
            dag.end(&p, id(&p, "a"), StageResult::empty(upstream));
            assert_eq!(dag.blocked(&p, id(&p, "b")).unwrap().0, Phase::Omitted);
        }
    }

    #[test]
    fn an_optional_input_from_a_skipped_stage_does_not_block() {
        let p = pipeline(
            "  a:\n    run: {command: [x]}\n    outputs: [o]\n  b:\n    inputs: {o: {from: a.o, optional: true}}\n    run: {command: [x]}\n",
        );
        let mut dag = Dag::new(&p);
        dag.end(&p, id(&p, "a"), StageResult::empty(Phase::Skipped));
        assert_eq!(dag.blocked(&p, id(&p, "b")), None);
    }

    #[test]
    fn a_stage_ended_before_its_turn_is_not_ready_again() {
        // A resumed run: `a` and `b` succeeded before; `b` ends before `a` releases it.
        let p = diamond();
        let mut dag = Dag::new(&p);
        dag.end(&p, id(&p, "a"), StageResult::empty(Phase::Succeeded));
        dag.end(&p, id(&p, "b"), StageResult::empty(Phase::Succeeded));
        assert_eq!(names(&p, &mut dag), ["c"]);
        // A reused stage ends first, before anything upstream of it.
        let mut dag = Dag::new(&p);
        dag.end(&p, id(&p, "c"), StageResult::empty(Phase::Succeeded));
        dag.end(&p, id(&p, "a"), StageResult::empty(Phase::Succeeded));
        assert_eq!(names(&p, &mut dag), ["b"], "c is not started again");
    }

    #[test]
    fn the_run_phase_follows_its_stages() {
        let p = pipeline("  a:\n    run: {command: [x]}\n  b:\n    run: {command: [x]}\n");
        let ended = |a: Phase, b: Option<Phase>, cancelled: bool| {
            let mut dag = Dag::new(&p);
            dag.end(&p, id(&p, "a"), StageResult::empty(a));
            if let Some(b) = b {
                dag.end(&p, id(&p, "b"), StageResult::empty(b));
            }
            dag.run_phase(&p, cancelled, |_| true)
        };
        assert_eq!(
            ended(Phase::Succeeded, Some(Phase::Skipped), false),
            Phase::Succeeded
        );
        assert_eq!(
            ended(Phase::Failed, Some(Phase::Error), false),
            Phase::Error
        );
        assert_eq!(
            ended(Phase::Succeeded, Some(Phase::Failed), false),
            Phase::Failed
        );
        assert_eq!(
            ended(Phase::Succeeded, None, false),
            Phase::Failed,
            "b never ended"
        );
        assert_eq!(
            ended(Phase::Succeeded, Some(Phase::Succeeded), true),
            Phase::Cancelled
        );
    }

    #[test]
    fn what_ended_stages_left_goes_to_their_dependants() {
        let p = diamond();
        let mut dag = Dag::new(&p);
        let left = StageResult {
            phase: Phase::Succeeded,
            outputs: BTreeMap::new(),
            values: serde_json::json!({"accuracy": 0.9}),
        };
        dag.end(&p, id(&p, "a"), left);
        let up = dag.upstream(&p, id(&p, "c"));
        assert_eq!(up.len(), 1);
        assert_eq!(up[&id(&p, "a")].values["accuracy"], 0.9);
        assert!(
            dag.upstream(&p, id(&p, "d")).is_empty(),
            "b and c have not ended"
        );
    }
}

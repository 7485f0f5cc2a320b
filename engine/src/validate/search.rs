//! A stage's `search:` checked and resolved: its method and what the method needs, its
//! budget, and its space, each problem located at its YAML path. (The `trial.*`
//! templates are checked with the other references, in `links.rs`.)

use crate::search::{Budget, Dim, Method, SearchPlan, Variant, MAX_TRIALS};
use crate::spec::{Goal, SearchSpec, SpaceSpec};
use crate::yaml::YamlPath;

use super::{is_ident, Cx, StageCx};

impl Cx<'_> {
    pub(super) fn check_search(&mut self, sc: &StageCx<'_>, s: &SearchSpec) -> Option<SearchPlan> {
        let path = sc.path.key("search");
        let errors = self.error_count();
        let alone = [
            (sc.spec.map.is_some(), "`map`"),
            (sc.spec.hook.is_some(), "`hook`"),
            (sc.spec.approval.is_some(), "`approval`"),
        ];
        for (_, with) in alone.iter().filter(|(has, _)| *has) {
            self.err_key(
                "invalid-search",
                &path,
                format!("a stage with `search` runs trials; it cannot also have {with}"),
            );
        }
        if !is_ident(&s.metric) {
            self.err(
                "invalid-search",
                &path.key("metric"),
                format!(
                    "metric `{}` must be a name trials report (letters, digits, `_`, `-`)",
                    s.metric
                ),
            );
        }
        if s.variant.is_some() && s.method != Method::Asha {
            self.err_key(
                "invalid-search",
                &path.key("variant"),
                "`variant` is ASHA's (`method: asha`): a grid or random search stops no trial early",
            );
        }
        for (field, value) in [
            ("max_trials", s.max_trials),
            ("max_concurrent", s.max_concurrent),
            (
                "reduction_factor",
                s.reduction_factor.map(|r| r.saturating_sub(1)),
            ),
            ("max_rungs", s.max_rungs),
        ] {
            if value == Some(0) {
                let least = match field {
                    "reduction_factor" => 2,
                    _ => 1,
                };
                self.err(
                    "invalid-search",
                    &path.key(field),
                    format!("`{field}` is at least {least}"),
                );
            }
        }
        let budget = self.search_budget(&path, s);
        let space = self.search_space(&path, s);
        let stale_after = s
            .stale_after
            .as_deref()
            .and_then(|t| self.duration(&path.key("stale_after"), t));
        if self.error_count() > errors {
            return None;
        }
        let mut plan = SearchPlan {
            method: s.method,
            variant: s.variant.unwrap_or(Variant::Promote),
            metric: s.metric.clone(),
            goal: s.goal.unwrap_or(Goal::Minimize),
            trials: s.max_trials.unwrap_or(0) as usize,
            max_concurrent: s.max_concurrent,
            max_failed_trials: s.max_failed_trials.unwrap_or(0),
            budget,
            reduction_factor: s.reduction_factor.unwrap_or(4),
            max_rungs: s.max_rungs.unwrap_or(5),
            seed: s.seed.unwrap_or(0),
            stale_after,
            space,
        };
        self.search_trials(&path, s, &mut plan)?;
        Some(plan)
    }

    fn error_count(&self) -> usize {
        self.diags.iter().filter(|d| d.is_error()).count()
    }

    /// How many trials the search starts: every point of a grid (at most `max_trials`),
    /// or `max_trials`, which a random search and ASHA need.
    fn search_trials(
        &mut self,
        path: &YamlPath,
        s: &SearchSpec,
        plan: &mut SearchPlan,
    ) -> Option<()> {
        let most = s.max_trials.map(|m| m as usize);
        if let Some(m) = most.filter(|m| *m > MAX_TRIALS) {
            self.err(
                "invalid-search",
                &path.key("max_trials"),
                format!("`max_trials: {m}` is over the {MAX_TRIALS} trials a search may start"),
            );
            return None;
        }
        let open: Vec<&String> = match s.method {
            Method::Grid => plan
                .space
                .iter()
                .filter(|(_, d)| d.grid().is_none())
                .map(|(n, _)| n)
                .collect(),
            _ => Vec::new(),
        };
        for name in &open {
            self.err(
                "invalid-search",
                &path.key("space").key(name.as_str()),
                format!(
                    "a grid search: `{name}` is a continuous range; give its `count` of points"
                ),
            );
        }
        if !open.is_empty() {
            return None;
        }
        match s.method {
            Method::Grid => match plan.grid() {
                Ok(points) => plan.trials = most.map_or(points.len(), |m| m.min(points.len())),
                Err(why) => {
                    self.err(
                        "invalid-search",
                        &path.key("space"),
                        format!("a grid search: {why}"),
                    );
                    return None;
                }
            },
            _ if most.is_none() => {
                self.err_key(
                    "invalid-search",
                    path,
                    "a `random` or `asha` search needs `max_trials`: how many points to draw",
                );
                return None;
            }
            _ => {}
        }
        Some(())
    }

    /// The budget: `min` at least 1 and at most `max`; ASHA needs one.
    fn search_budget(&mut self, path: &YamlPath, s: &SearchSpec) -> Option<Budget> {
        let Some(b) = &s.budget else {
            if s.method == Method::Asha {
                self.err_key(
                    "invalid-search",
                    path,
                    "an `asha` search needs a `budget: {unit, min, max}`: what its rungs grow",
                );
            }
            return None;
        };
        if b.min == 0 || b.min > b.max {
            self.err(
                "invalid-search",
                &path.key("budget"),
                format!(
                    "budget `min: {}`, `max: {}`: `min` is at least 1 and at most `max`",
                    b.min, b.max
                ),
            );
            return None;
        }
        Some(Budget {
            unit: b.unit.clone().unwrap_or_else(|| "steps".into()),
            min: b.min,
            max: b.max,
        })
    }

    /// The space's dimensions, each exactly one of the four kinds, with a range that
    /// holds a value.
    fn search_space(&mut self, path: &YamlPath, s: &SearchSpec) -> Vec<(String, Dim)> {
        if s.space.is_empty() {
            self.err_key(
                "invalid-search",
                &path.key("space"),
                "`space` names no hyperparameter",
            );
        }
        let mut dims = Vec::new();
        for (name, d) in &s.space {
            let at = path.key("space").key(name);
            if !is_ident(name) {
                self.err_key("invalid-search", &at, format!("hyperparameter `{name}` must start with a letter or `_` and hold only letters, digits, `_` and `-`"));
            }
            match dim(d) {
                Ok(dim) => dims.push((name.clone(), dim)),
                Err(why) => {
                    self.err(
                        "invalid-search",
                        &at,
                        format!("hyperparameter `{name}`: {why}"),
                    );
                }
            }
        }
        dims
    }
}

/// One dimension, or what is wrong with it.
fn dim(d: &SpaceSpec) -> Result<Dim, String> {
    let kinds = [
        d.uniform.is_some(),
        d.log_uniform.is_some(),
        d.int.is_some(),
        d.choice.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err("give exactly one of `uniform`, `log_uniform`, `int` and `choice`".into());
    }
    if d.count == Some(0) || (d.count.is_some() && (d.int.is_some() || d.choice.is_some())) {
        return Err(
            "`count` (at least 1) is the grid's points of a `uniform` or `log_uniform` range"
                .into(),
        );
    }
    let range = |[lo, hi]: [f64; 2], kind: &str| match lo.is_finite() && hi.is_finite() && lo < hi {
        true => Ok((lo, hi)),
        false => Err(format!(
            "`{kind}: [{lo}, {hi}]` needs finite ends, the first below the second"
        )),
    };
    if let Some(r) = d.uniform {
        let (lo, hi) = range(r, "uniform")?;
        return Ok(Dim::Uniform {
            lo,
            hi,
            count: d.count,
        });
    }
    if let Some(r) = d.log_uniform {
        let (lo, hi) = range(r, "log_uniform")?;
        if lo <= 0.0 {
            return Err(format!("`log_uniform: [{lo}, {hi}]` needs ends above 0"));
        }
        return Ok(Dim::LogUniform {
            lo,
            hi,
            count: d.count,
        });
    }
    if let Some([lo, hi]) = d.int {
        if lo > hi {
            return Err(format!(
                "`int: [{lo}, {hi}]`: the first is at most the second"
            ));
        }
        return Ok(Dim::Int { lo, hi });
    }
    match d.choice.as_deref() {
        Some([]) | None => Err("`choice` lists no value".into()),
        Some(values) => Ok(Dim::Choice(values.to_vec())),
    }
}

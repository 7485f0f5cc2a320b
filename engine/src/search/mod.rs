//! Searches over a stage's hyperparameters: the validated plan of a `search:` (its space,
//! its rungs), the points of the space each trial gets, and the synchronous core that
//! decides which trial runs next and which stop ([`rungs::Search`]); the runner drives it
//! with attempts and records every decision before acting on it.

pub mod lines;
pub mod report;
pub mod rungs;

use rand::{Rng as _, SeedableRng as _};
use serde_json::{Map, Value};

pub use crate::spec::{Goal, SearchMethod as Method, SearchVariant as Variant};

/// A validated `search:`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SearchPlan {
    pub method: Method,
    pub variant: Variant,
    pub metric: String,
    pub goal: Goal,
    /// How many trials start: every grid point (at most `max_trials`), or `max_trials`.
    pub trials: usize,
    pub max_concurrent: Option<u32>,
    pub max_failed_trials: u32,
    /// The budget's unit, least and most; none when the search has no budget.
    pub budget: Option<Budget>,
    pub reduction_factor: u32,
    pub max_rungs: u32,
    pub seed: u64,
    pub stale_after: Option<std::time::Duration>,
    pub space: Vec<(String, Dim)>,
}

/// What a trial counts, and the least and most of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    pub unit: String,
    pub min: u64,
    pub max: u64,
}

/// One hyperparameter's values.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dim {
    Uniform {
        lo: f64,
        hi: f64,
        count: Option<u32>,
    },
    LogUniform {
        lo: f64,
        hi: f64,
        count: Option<u32>,
    },
    Int {
        lo: i64,
        hi: i64,
    },
    Choice(Vec<Value>),
}

impl Dim {
    /// The grid's points of this dimension; none for a continuous range without `count`.
    pub fn grid(&self) -> Option<Vec<Value>> {
        let spaced = |lo: f64, hi: f64, n: u32, f: &dyn Fn(f64) -> f64| -> Vec<Value> {
            (0..n)
                .map(|i| match n {
                    1 => lo,
                    _ => lo + (hi - lo) * f64::from(i) / f64::from(n - 1),
                })
                .map(|x| Value::from(f(x)))
                .collect()
        };
        match self {
            Dim::Uniform { lo, hi, count } => Some(spaced(*lo, *hi, (*count)?, &|x| x)),
            Dim::LogUniform { lo, hi, count } => {
                Some(spaced(lo.ln(), hi.ln(), (*count)?, &f64::exp))
            }
            Dim::Int { lo, hi } => Some((*lo..=*hi).map(Value::from).collect()),
            Dim::Choice(c) => Some(c.clone()),
        }
    }

    /// A point drawn from the dimension.
    fn draw(&self, rng: &mut rand_chacha::ChaCha8Rng) -> Value {
        match self {
            Dim::Uniform { lo, hi, .. } => Value::from(rng.random_range(*lo..=*hi)),
            Dim::LogUniform { lo, hi, .. } => {
                Value::from(rng.random_range(lo.ln()..=hi.ln()).exp())
            }
            Dim::Int { lo, hi } => Value::from(rng.random_range(*lo..=*hi)),
            Dim::Choice(c) => c[rng.random_range(0..c.len())].clone(),
        }
    }
}

/// The most trials a search may start (a grid's points past it are refused).
pub const MAX_TRIALS: usize = 10_000;

/// Why a search's space makes no grid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    /// A dimension with no points of its own.
    #[error("`{0}` is a continuous range: a grid needs its `count` of points")]
    Continuous(String),
    #[error("the grid has more than {MAX_TRIALS} points; narrow it or use `random`")]
    TooLarge,
}

impl SearchPlan {
    /// The budget of each rung, smallest first: ASHA's `max / η^(n-1-k)` for `n` rungs
    /// (as many as fit between `min` and `max`, at most `max_rungs`); one rung at `max`
    /// for a grid or random search; none without a budget.
    pub fn rungs(&self) -> Vec<u64> {
        let Some(b) = &self.budget else {
            return Vec::new();
        };
        if self.method != Method::Asha {
            return vec![b.max];
        }
        let eta = u64::from(self.reduction_factor.max(2));
        let mut n = 1u32;
        let mut low = b.max;
        while n < self.max_rungs.max(1) && low / eta >= b.min.max(1) {
            low /= eta;
            n += 1;
        }
        (0..n)
            .map(|k| b.max / eta.pow(n - 1 - k))
            .map(|r| r.max(b.min))
            .collect()
    }

    /// The points of the grid, in order (the last dimension fastest); `Err` names a
    /// dimension that has none, or says the grid is too large.
    pub fn grid(&self) -> Result<Vec<Map<String, Value>>, GridError> {
        let mut points = vec![Map::new()];
        for (name, dim) in &self.space {
            let values = dim
                .grid()
                .ok_or_else(|| GridError::Continuous(name.clone()))?;
            if points.len().saturating_mul(values.len()) > MAX_TRIALS {
                return Err(GridError::TooLarge);
            }
            points = points
                .into_iter()
                .flat_map(|p| {
                    values.iter().map(move |v| {
                        let mut p = p.clone();
                        p.insert(name.clone(), v.clone());
                        p
                    })
                })
                .collect();
        }
        Ok(points)
    }

    /// The params of trial `index`: the grid's `index`-th point, or a point drawn from
    /// the space by a generator seeded with the search's seed and the index (the same
    /// trial gets the same params on every platform and on a resume).
    pub fn params(&self, index: usize) -> Map<String, Value> {
        if self.method == Method::Grid {
            if let Ok(mut points) = self.grid() {
                if index < points.len() {
                    return points.swap_remove(index);
                }
            }
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            self.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        self.space
            .iter()
            .map(|(name, dim)| (name.clone(), dim.draw(&mut rng)))
            .collect()
    }

    /// Whether metric `a` is better than `b` for the search's goal.
    pub fn better(&self, a: f64, b: f64) -> bool {
        match self.goal {
            Goal::Minimize => a < b,
            Goal::Maximize => a > b,
        }
    }

    /// A trial's id: `t` and its index (`t007`), the same on every try of the run.
    pub fn trial_id(index: usize) -> String {
        format!("t{index:03}")
    }
}

/// What `search preview` prints: per rung, its budget, how many trials reach it, and the
/// budget they use there (counted once: a promoted trial resumes from its checkpoint).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RungPreview {
    pub rung: usize,
    pub budget: u64,
    pub trials: u64,
    pub budget_used: u64,
}

impl SearchPlan {
    /// The rungs of a search run to its end with every trial succeeding: ASHA keeps
    /// `1/η` of a rung's trials for the next (at least one); grid and random run every
    /// trial to the full budget.
    pub fn preview(&self) -> Vec<RungPreview> {
        let eta = u64::from(self.reduction_factor.max(2));
        let mut trials = self.trials as u64;
        let mut before = 0;
        let mut rows = Vec::new();
        for (k, budget) in self.rungs().into_iter().enumerate() {
            if k > 0 {
                trials = (trials / eta).max(1);
            }
            rows.push(RungPreview {
                rung: k,
                budget,
                trials,
                budget_used: trials * (budget - before),
            });
            before = budget;
        }
        rows
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// 27 trials of ASHA's budget 1 to 27, η 3, over three kinds of dimension.
    pub(crate) fn plan(method: Method) -> SearchPlan {
        SearchPlan {
            method,
            variant: Variant::Promote,
            metric: "loss".into(),
            goal: Goal::Minimize,
            trials: 27,
            max_concurrent: None,
            max_failed_trials: 0,
            budget: Some(Budget {
                unit: "epochs".into(),
                min: 1,
                max: 27,
            }),
            reduction_factor: 3,
            max_rungs: 5,
            seed: 11,
            stale_after: None,
            space: vec![
                (
                    "lr".into(),
                    Dim::LogUniform {
                        lo: 1e-5,
                        hi: 0.1,
                        count: Some(3),
                    },
                ),
                ("depth".into(), Dim::Choice(vec![2.into(), 4.into()])),
                ("layers".into(), Dim::Int { lo: 1, hi: 3 }),
            ],
        }
    }

    #[test]
    fn asha_rungs_grow_by_the_factor_up_to_the_budget_and_the_most_rungs() {
        let mut p = plan(Method::Asha);
        assert_eq!(p.rungs(), vec![1, 3, 9, 27]);
        p.max_rungs = 2;
        assert_eq!(p.rungs(), vec![9, 27]);
        p.max_rungs = 5;
        p.reduction_factor = 4;
        assert_eq!(p.rungs(), vec![1, 6, 27]);
        p.budget.as_mut().unwrap().min = 5;
        assert_eq!(p.rungs(), vec![6, 27]);
        assert_eq!(plan(Method::Random).rungs(), vec![27]);
    }

    #[test]
    fn random_params_are_drawn_within_the_space_the_same_from_the_same_seed() {
        let p = plan(Method::Random);
        let a: Vec<_> = (0..50).map(|i| p.params(i)).collect();
        let b: Vec<_> = (0..50).map(|i| p.params(i)).collect();
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
        for params in &a {
            let lr = params["lr"].as_f64().unwrap();
            assert!((1e-5..=0.1).contains(&lr), "{lr}");
            assert!([2, 4].contains(&params["depth"].as_i64().unwrap()));
            assert!((1..=3).contains(&params["layers"].as_i64().unwrap()));
        }
        // Drawn log-uniformly: about half below the range's geometric middle (1e-3).
        let low = a
            .iter()
            .filter(|p| p["lr"].as_f64().unwrap() < 1e-3)
            .count();
        assert!((12..=38).contains(&low), "{low} of 50 below 1e-3");
        let mut other = plan(Method::Random);
        other.seed = 12;
        assert_ne!(other.params(0), a[0]);
    }

    #[test]
    fn a_grid_is_every_point_the_last_dimension_fastest() {
        let p = plan(Method::Grid);
        let g = p.grid().unwrap();
        assert_eq!(g.len(), 3 * 2 * 3);
        assert_eq!(g[0]["layers"], 1);
        assert_eq!(g[1]["layers"], 2);
        assert_eq!(g[3]["depth"], 4);
        let lrs: Vec<f64> = [0, 6, 12]
            .iter()
            .map(|&i| g[i]["lr"].as_f64().unwrap())
            .collect();
        for (got, want) in lrs.iter().zip([1e-5, 1e-3, 0.1]) {
            assert!((got / want - 1.0).abs() < 1e-9, "{got} vs {want}");
        }
        assert_eq!(p.params(5), g[5]);
        let mut open = plan(Method::Grid);
        open.space[0].1 = Dim::Uniform {
            lo: 0.0,
            hi: 1.0,
            count: None,
        };
        assert_eq!(open.grid().unwrap_err(), GridError::Continuous("lr".into()));
    }

    #[test]
    fn the_preview_of_asha_uses_a_fraction_of_the_grid_budget() {
        let rows = plan(Method::Asha).preview();
        let trials: Vec<u64> = rows.iter().map(|r| r.trials).collect();
        assert_eq!(trials, vec![27, 9, 3, 1]);
        let used: u64 = rows.iter().map(|r| r.budget_used).sum();
        assert_eq!(used, 27 + 9 * 2 + 3 * 6 + 18);
        let full: u64 = plan(Method::Random)
            .preview()
            .iter()
            .map(|r| r.budget_used)
            .sum();
        assert_eq!(full, 27 * 27);
    }
}

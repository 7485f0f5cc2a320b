//! A stage's `when`, read before it starts: a value it names that the stage it reads
//! from did not report is an error naming what that stage has, not a silent `false`
//! (`values.line` for `lines` skipped `promote` without a word).

use std::collections::BTreeMap;

use super::dag::StageResult;
use crate::expr::Expr;
use crate::plan::{Pipeline, StageId};
use crate::state::Phase;
use crate::template::Ref;

/// The first `stages.S.values.KEY…` of `expr` that stage `S` succeeded without
/// reporting, said with the values it did report. A stage that did not succeed (skipped,
/// reused without values) reports nothing to miss.
pub(super) fn unreported(
    pipeline: &Pipeline,
    upstream: &BTreeMap<StageId, StageResult>,
    expr: &Expr,
) -> Option<String> {
    for (r, _) in expr.refs() {
        let Ref::StageValue { stage, key } = r else {
            continue;
        };
        let Some(result) = pipeline
            .stage_by_name(stage)
            .and_then(|s| upstream.get(&s.id))
            .filter(|r| r.phase == Phase::Succeeded)
        else {
            continue;
        };
        let mut v = &result.values;
        for (depth, k) in key.iter().enumerate() {
            match v.get(k) {
                Some(inner) => v = inner,
                None => {
                    let has: Vec<&str> = v
                        .as_object()
                        .map(|o| {
                            o.keys()
                                .map(String::as_str)
                                .filter(|k| *k != "series")
                                .collect()
                        })
                        .unwrap_or_default();
                    let has = match has.is_empty() {
                        true => "none".to_owned(),
                        false => has.join(", "),
                    };
                    return Some(format!(
                        "`when` reads `{r}`, and stage `{stage}` reported no `{}` (its values: {has})",
                        key[..=depth].join(".")
                    ));
                }
            }
        }
    }
    None
}

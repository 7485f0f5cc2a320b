//! A stage's `with:` checked against the params its step declares: unknown, missing,
//! wrong type, out of range, not one of the allowed values, not matching the pattern —
//! each located in the pipeline and naming the declaration it broke.

use super::file::admits;
use super::Plugin;
use crate::diag::{did_you_mean, one_of, Diagnostic};
use crate::yaml::{Node, YamlPath};

/// Every problem of a stage's `with:` (`node`, its values typed where a template's type is
/// known) against `plugin`'s params; `with_path` is where the block is, `uses_path` where
/// a missing one is reported.
pub fn check_with(
    plugin: &Plugin,
    node: Option<&Node<'_>>,
    with_path: &YamlPath,
    uses_path: &YamlPath,
) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    let step = &plugin.checked.spec;
    let declared = |name: &str| {
        let line = plugin.checked.lines.get(name).copied().unwrap_or(1);
        format!("declared at {}:{line}", plugin.file.display())
    };
    let entries = match node.map(|n| (n, n.as_map())) {
        Some((_, Some(entries))) => entries,
        Some((n, None)) if n.scalar() != Some(crate::yaml::Resolved::Null) => {
            diags.push(
                Diagnostic::new(
                    "invalid-type",
                    format!(
                        "step `{}`: `with` is a mapping of its params; found {}",
                        step.name,
                        n.kind()
                    ),
                )
                .path(with_path),
            );
            return diags;
        }
        _ => &[][..],
    };
    let names: Vec<&str> = step.params.keys().map(String::as_str).collect();
    for e in entries {
        let key: &str = &e.key;
        let path = with_path.key(key);
        let Some(decl) = step.params.get(key) else {
            let mut d = Diagnostic::new(
                "unknown-field",
                format!("step `{}` has no param `{key}`", step.name),
            )
            .path(&path)
            .note(match names.is_empty() {
                true => format!("it takes no params ({})", plugin.file.display()),
                false => format!("its params: {} ({})", one_of(&names), plugin.file.display()),
            });
            d.hint = did_you_mean(key, names.iter().copied());
            diags.push(d);
            continue;
        };
        if let Err(why) = admits(decl, &e.value.to_json(), true) {
            diags.push(
                Diagnostic::new(
                    "invalid-param",
                    format!("step `{}`: param `{key}`: {why}", step.name),
                )
                .path(&path)
                .note(format!("`{key}` {}", declared(key))),
            );
        }
    }
    for (name, decl) in &step.params {
        let given = entries.iter().any(|e| &*e.key == name.as_str());
        if !given && decl.default.is_none() {
            let at = if node.is_some() { with_path } else { uses_path };
            diags.push(
                Diagnostic::new(
                    "missing-field",
                    format!(
                        "step `{}` needs param `{name}` ({})",
                        step.name,
                        decl.kind.article()
                    ),
                )
                .path(at)
                .note(format!("`{name}` {}, without a default", declared(name)))
                .hint(format!("add `with: {{{name}: …}}`")),
            );
        }
    }
    diags
}

//! Built-in steps of the driving-data loop: their names, versions, inputs, outputs,
//! configuration types, and what they do: one module per step (its `with:` type,
//! registration and run together), through one adapter (`builtin.rs`).
//!
//! Each step's `with:` block is a serde type here, checked at `drivetrain validate` time
//! through the engine's located deserializer (and more deeply by `check_semantics`: SQL
//! rules against the frame schema, gate conditions against the metrics), and published as
//! JSON Schema. [`all`] is the one explicit list the binary registers. A step runs as
//! `drivetrain step NAME` with the attempt's environment: a child of the engine locally,
//! the container's command on a cluster.

use drivetrain_engine::step::Step;

mod builtin;
pub mod decode;
pub mod gate;
pub mod ingest;
pub mod label;
pub mod logsource;
pub mod mcapio;
pub mod mine;
pub mod model;
pub mod promote;
pub mod registry;
pub mod rng;
pub mod sim;
mod sim_encode;
pub mod table;
pub mod train;
pub mod validate;

/// Every built-in step, in the order of the driving loop.
pub fn all() -> Vec<Box<dyn Step>> {
    let mut all = vec![sim::step(), ingest::step(), mine::step()];
    all.extend(label::steps());
    all.extend([train::step(), validate::step(), promote::step()]);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use drivetrain_engine::yaml::YamlPath;

    #[test]
    fn names_are_unique_and_outputs_declared() {
        let steps = all();
        let mut names: Vec<_> = steps.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), steps.len());
        assert!(steps.iter().all(|s| !s.outputs().is_empty()));
    }

    #[test]
    fn configs_are_checked_with_locations() {
        let node = drivetrain_engine::yaml::parse("budget: lots\nformats: [coco, yolo]\n").unwrap();
        let step = all()
            .into_iter()
            .find(|s| s.name() == "label-export")
            .unwrap();
        let diags = step.check_config(Some(&node), &YamlPath::root().key("with"));
        assert_eq!(diags.len(), 1, "{diags:?}");
        assert_eq!(diags[0].path.as_deref(), Some("with.budget"));
        let schema = step.config_schema();
        assert!(schema["properties"]["budget"].is_object());
    }

    #[test]
    fn a_missing_with_block_reports_required_fields() {
        let step = all()
            .into_iter()
            .find(|s| s.name() == "mine-corner-cases")
            .unwrap();
        let diags = step.check_config(None, &YamlPath::root().key("with"));
        assert_eq!(diags[0].code, "missing-field");
        assert!(diags[0].message.contains("rules"));
    }
}

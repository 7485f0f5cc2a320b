//! Why a stage may not see a path the engine's machine has: the engine's own paths are
//! hidden from every stage, and a root engine's stages run as host `nobody`, whom a folder
//! closed to other users keeps out. Said in a failed stage's reason, with what to change
//! ([`drivetrain_engine::executor::Executor::unseen`]).

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use drivetrain_engine::executor::PathAccess;

use super::userns;

/// Why a stage may not see `path`; `nobody`: its user is host `nobody` (a root engine's
/// stage). `None` where the path is not there for the engine either, or nothing of
/// containment stands in its way.
pub(super) fn why(path: &Path, access: &[PathAccess], nobody: bool) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    let shown = path.display();
    if let Some(a) = access
        .iter()
        .find(|a| a.hidden && path.starts_with(&a.path))
    {
        return Some(format!(
            "{shown} is the engine's ({} is hidden from every stage); a stage reads what it is given: inputs, its folder, volumes",
            a.path.display()
        ));
    }
    if !nobody {
        return None;
    }
    // The shallowest folder on the way the stage user cannot search.
    let closed = userns::closed_on_the_way(&[path.to_path_buf()]);
    if let Some((dir, _)) = closed.first() {
        let mode = std::fs::metadata(dir).map(|m| m.mode()).unwrap_or_default();
        return Some(format!(
            "{shown} exists on this machine, but {} (mode {:o}) lets no other user in, and a root engine's stages run as host `nobody`: give it to the stage as a volume (`volumes: [{{name: data, host_path: {shown}, mount_path: {shown}, read_only: true}}]`), or open {} to others (`chmod o+x`)",
            dir.display(),
            mode & 0o7777,
            dir.display()
        ));
    }
    (!userns::open_to_stage(&meta, userns::to_use(&meta))).then(|| {
        format!(
            "{shown} exists on this machine, but its mode ({:o}) lets no other user {} it, and a root engine's stages run as host `nobody`: open it to others (`chmod o+{}`), or run the engine as its owner",
            meta.mode() & 0o7777,
            if meta.is_dir() { "list" } else { "read" },
            if meta.is_dir() { "rx" } else { "r" }
        )
    })
}

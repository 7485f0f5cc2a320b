//! What a run executes of a plugin step is exactly what was digested: when a run starts,
//! each plugin's folder is copied into the home once per digest
//! (`plugins/steps/<digest>/`, read-only, checked against the digest after the copy),
//! and the run's attempts read `{{ step.dir }}` there. Editing a step's script while a
//! run is going (argo-workflows#8276's "template changed during a run") changes nothing
//! of that run, and an edit between validation and the start fails the stage saying so.

use std::path::{Path, PathBuf};

use super::{PluginError, PluginId};

/// The folder of `id`'s snapshot in `home`, made now if it is not there.
pub fn snapshot(id: &PluginId, home: &Path) -> Result<PathBuf, PluginError> {
    let hex = id.digest.trim_start_matches("sha256:");
    let steps = home.join("plugins").join("steps");
    let target = steps.join(hex);
    if target.is_dir() {
        return Ok(target);
    }
    let tmp = steps.join(format!(".{hex}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let made = copy(&id.dir, &tmp).and_then(|()| {
        let now = super::digest(&tmp)?;
        match now == id.digest {
            true => Ok(()),
            false => Err(PluginError::Plugin(format!(
                "plugin `{}@{}` changed after it was validated: its folder {} is {now} now, the run planned {}; start the run again",
                id.name,
                id.version,
                id.dir.display(),
                id.digest
            ))),
        }
    });
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    read_only(&tmp);
    match std::fs::rename(&tmp, &target) {
        Ok(()) => Ok(target),
        // Another engine made the same snapshot meanwhile: the same files.
        Err(_) if target.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(target)
        }
        Err(e) => Err(PluginError::Host(format!(
            "cannot keep plugin `{}` in {}: {e}",
            id.name,
            target.display()
        ))),
    }
}

/// Copies the step's own files (what [`super::digest`] covers) from `from` to `to`,
/// keeping each file's mode.
fn copy(from: &Path, to: &Path) -> Result<(), PluginError> {
    let mut files = Vec::new();
    super::walk(from, from, &mut files, 0)?;
    for rel in files {
        let (src, dst) = (from.join(&rel), to.join(&rel));
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(|e| PluginError::io(parent, e))?;
        }
        std::fs::copy(&src, &dst).map_err(|e| PluginError::io(&src, e))?;
    }
    std::fs::create_dir_all(to).map_err(|e| PluginError::io(to, e))
}

/// Makes a snapshot read-only for everyone and readable by everyone (a root engine's
/// stages are host `nobody`); directories stay listable.
fn read_only(dir: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            read_only(&path);
        } else if let Ok(meta) = std::fs::metadata(&path) {
            let exec = meta.permissions().mode() & 0o111 != 0;
            let mode = if exec { 0o555 } else { 0o444 };
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode));
        }
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555));
}

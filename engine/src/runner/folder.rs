//! The pipeline file's folder, where a user's scripts live beside the pipeline: a relative
//! `workdir` and the relative paths a command names are read from it (as `ingest`'s
//! relative `source:` is), and `{{ pipeline.dir }}` names it.

use std::path::{Path, PathBuf};

/// The folder of the run's pipeline `file`; `None` for YAML posted to a server, which the
/// server keeps in its home's `submitted/` (no folder of the user's).
pub(crate) fn pipeline_dir(file: &str, home: &Path) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(file).ok()?.parent()?.to_path_buf();
    let submitted = std::fs::canonicalize(home.join("submitted")).ok();
    (Some(&dir) != submitted.as_ref()).then_some(dir)
}

/// The working directory `rendered` names: a relative one is the pipeline's folder's.
pub(crate) fn workdir(rendered: &str, folder: Option<&Path>) -> Result<PathBuf, String> {
    let w = Path::new(rendered);
    match (w.is_absolute(), folder) {
        (true, _) => Ok(w.to_path_buf()),
        (false, Some(f)) => Ok(f.join(w).components().collect()),
        (false, None) => Err(format!(
            "`workdir: {rendered}` is relative to the pipeline file's folder, and a pipeline posted to a server has none: give an absolute path, or serve the pipeline from its file"
        )),
    }
}

/// The file in `folder` that argument `index` of a command without a `workdir` names, if
/// it names one: a relative path (the program itself only with a `/`, as the shell looks
/// a bare name up in `PATH`) to a file that is there.
pub fn named_file(index: usize, arg: &str, folder: &Path) -> Option<PathBuf> {
    let p = Path::new(arg);
    let candidate = !arg.is_empty()
        && !arg.starts_with('-')
        && p.is_relative()
        && (index > 0 || arg.contains('/'));
    let file = folder.join(p);
    (candidate && file.is_file()).then_some(file)
}

/// Gives the arguments of a command without a `workdir` that name files in `folder` as
/// their absolute paths, so `[python3, train.py]` runs the `train.py` beside the pipeline
/// wherever the attempt's working directory is.
pub fn resolve_args(argv: &mut [String], folder: &Path) {
    for (i, a) in argv.iter_mut().enumerate() {
        if let Some(file) = named_file(i, a, folder) {
            *a = file.display().to_string();
        }
    }
}

/// How the cache key writes the pipeline's folder: the same in every clone of a project.
pub(crate) const SYMBOL: &str = "{{ pipeline.dir }}";

/// The paths a command may name files by (`argv` and `workdir` as the cache key renders
/// them, with [`SYMBOL`] for the folder; which are files is the caller's to ask), each
/// with its name in the key: relative to the folder
/// where it is in it, so a second clone at another path has the same key.
pub(crate) fn named_files(
    argv: &[String],
    workdir: Option<&str>,
    folder: Option<&Path>,
) -> Vec<(String, PathBuf)> {
    let real = |s: &str| match folder {
        Some(f) => s.replace(SYMBOL, &f.display().to_string()),
        None => s.to_owned(),
    };
    let dir = workdir
        .map(|w| Path::new(&real(w)).to_path_buf())
        .map(|w| match folder {
            Some(f) if w.is_relative() => f.join(w),
            _ => w,
        });
    let mut files = Vec::new();
    for (i, a) in argv.iter().enumerate() {
        let p = PathBuf::from(real(a));
        let path = match (&dir, folder) {
            _ if p.is_absolute() => p,
            (Some(w), _) if !a.starts_with('-') => w.join(p),
            (None, Some(f)) => match named_file(i, a, f) {
                Some(file) => file,
                None => continue,
            },
            _ => continue,
        };
        let name = match folder.and_then(|f| path.strip_prefix(f).ok()) {
            Some(rel) => format!("{SYMBOL}/{}", rel.display()),
            None => path.display().to_string(),
        };
        files.push((name, path));
    }
    files
}

/// The code in the pipeline's folder: `{"commit", "dirty", "repo"}` of the git work tree
/// it is in (dirty: tracked files changed since the commit), or null outside one (or
/// without git). What the commands name is digested into each stage's key already
/// (`file:NAME`).
pub(crate) fn code(folder: &Path) -> serde_json::Value {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(folder)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let (Some(commit), Some(repo)) = (
        git(&["rev-parse", "HEAD"]),
        git(&["rev-parse", "--show-toplevel"]),
    ) else {
        return serde_json::Value::Null;
    };
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    serde_json::json!({"commit": commit, "dirty": dirty, "repo": repo})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_the_folders() {
        let dir = std::env::temp_dir().join(format!("dt-folder-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("scripts")).unwrap();
        std::fs::write(dir.join("train.py"), "").unwrap();
        std::fs::write(dir.join("scripts/prep.sh"), "").unwrap();
        let mut argv: Vec<String> = ["python3", "train.py", "--data", "missing.csv", "-v"]
            .map(String::from)
            .to_vec();
        resolve_args(&mut argv, &dir);
        assert_eq!(argv[1], dir.join("train.py").display().to_string());
        assert_eq!(argv[0], "python3", "a bare program is looked up in PATH");
        assert_eq!(argv[3], "missing.csv", "only files that are there");
        let mut argv = vec!["scripts/prep.sh".to_owned()];
        resolve_args(&mut argv, &dir);
        assert_eq!(argv[0], dir.join("scripts/prep.sh").display().to_string());
        assert_eq!(workdir(".", Some(&dir)).unwrap(), dir);
        assert_eq!(workdir("/srv", None).unwrap(), PathBuf::from("/srv"));
        assert!(workdir(".", None)
            .unwrap_err()
            .contains("posted to a server"));
        let argv = ["python3", "train.py", "{{ pipeline.dir }}/scripts/prep.sh"].map(String::from);
        let named: Vec<String> = named_files(&argv, None, Some(&dir))
            .into_iter()
            .map(|(name, path)| {
                assert!(path.is_file(), "{}", path.display());
                name
            })
            .collect();
        assert_eq!(
            named,
            [
                "{{ pipeline.dir }}/train.py",
                "{{ pipeline.dir }}/scripts/prep.sh"
            ]
        );
        let in_scripts = named_files(
            &["sh".into(), "prep.sh".into()],
            Some("scripts"),
            Some(&dir),
        );
        let files: Vec<&str> = in_scripts
            .iter()
            .filter(|(_, path)| path.is_file())
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(files, ["{{ pipeline.dir }}/scripts/prep.sh"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The GPUs of this machine, for local runs: what stages with `resources: {gpu: N}` may
//! claim, each by the name `CUDA_VISIBLE_DEVICES` knows it by.
//!
//! Found, in order: NVML (`libnvidia-ml.so`, loaded at run time by `nvml-wrapper`; absent
//! on a machine without the NVIDIA driver, which then simply has none), else `nvidia-smi
//! -L`. An outer `CUDA_VISIBLE_DEVICES` (a scheduler's slice of the machine) is honoured:
//! its entries are the GPUs, as it names them. `--gpus N` / `DRIVETRAIN_LOCAL_GPUS`
//! override the count. A detected GPU is named by its UUID, which means the same device
//! whatever order CUDA enumerates in.

use std::process::Command;

/// One GPU a stage can be given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// What goes into the stage's `CUDA_VISIBLE_DEVICES`: a UUID (`GPU-…`) or an index.
    pub id: String,
    /// The model, where known (`NVIDIA H100 80GB HBM3`).
    pub name: Option<String>,
}

/// The GPUs found and how.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gpus {
    pub gpus: Vec<Gpu>,
    /// `NVML`, `nvidia-smi`, `CUDA_VISIBLE_DEVICES`, `DRIVETRAIN_LOCAL_GPUS`, `--gpus`,
    /// or empty for none found.
    pub source: String,
}

impl Gpus {
    /// The identifiers, in order.
    pub fn ids(&self) -> Vec<String> {
        self.gpus.iter().map(|g| g.id.clone()).collect()
    }
}

/// The machine's GPUs; `count` (`--gpus N`, else `DRIVETRAIN_LOCAL_GPUS`) overrides how
/// many there are.
pub fn detect(count: Option<usize>) -> Gpus {
    let count = count.map(|n| (n, "--gpus")).or_else(|| {
        std::env::var("DRIVETRAIN_LOCAL_GPUS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map(|n| (n, "DRIVETRAIN_LOCAL_GPUS"))
    });
    let found = from_nvml().or_else(nvidia_smi).unwrap_or_default();
    let outer = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let visible = match outer.as_deref() {
        Some(list) => Gpus {
            gpus: visible_devices(list)
                .into_iter()
                .map(|id| Gpu {
                    name: named(&found, &id),
                    id,
                })
                .collect(),
            source: "CUDA_VISIBLE_DEVICES".into(),
        },
        None => found,
    };
    match count {
        None => visible,
        // Told how many: the first N of those seen, then indices for the rest.
        Some((n, source)) => Gpus {
            gpus: (0..n)
                .map(|i| {
                    visible.gpus.get(i).cloned().unwrap_or(Gpu {
                        id: i.to_string(),
                        name: None,
                    })
                })
                .collect(),
            source: source.into(),
        },
    }
}

/// The entries of a `CUDA_VISIBLE_DEVICES` value as CUDA reads them: comma-separated,
/// up to the first invalid one (`-1` hides every GPU).
pub fn visible_devices(list: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let valid =
            entry.parse::<u32>().is_ok() || entry.starts_with("GPU-") || entry.starts_with("MIG-");
        if !valid {
            break;
        }
        out.push(entry.to_owned());
    }
    out
}

/// The device nodes a stage given the GPUs of `visible` (its `CUDA_VISIBLE_DEVICES`)
/// needs: each GPU's `/dev/nvidiaN` (N its minor number, from NVML where it is there, else
/// the index) and the driver's control nodes, those this machine has.
pub fn device_nodes(visible: &str) -> Vec<std::path::PathBuf> {
    let ids = visible_devices(visible);
    if ids.is_empty() {
        return Vec::new();
    }
    let minor = |id: &str| -> Option<u32> {
        let index = id.parse::<u32>().ok();
        nvml()
            .and_then(|n| device(n, id))
            .and_then(|d| d.minor_number().ok())
            .or(index)
    };
    [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
    ]
    .iter()
    .map(|n| std::path::PathBuf::from(format!("/dev/{n}")))
    .chain(
        ids.iter()
            .filter_map(|id| minor(id))
            .map(|m| std::path::PathBuf::from(format!("/dev/nvidia{m}"))),
    )
    .filter(|p| p.exists())
    .collect()
}

/// The model of the GPU `id` (an index or a UUID) among `found`.
fn named(found: &Gpus, id: &str) -> Option<String> {
    let by_index = id.parse::<usize>().ok().and_then(|i| found.gpus.get(i));
    by_index
        .or_else(|| found.gpus.iter().find(|g| g.id == id))
        .and_then(|g| g.name.clone())
}

/// NVML, loaded once per process (`None` on a machine without the NVIDIA driver).
pub fn nvml() -> Option<&'static nvml_wrapper::Nvml> {
    static NVML: std::sync::OnceLock<Option<nvml_wrapper::Nvml>> = std::sync::OnceLock::new();
    NVML.get_or_init(|| nvml_wrapper::Nvml::init().ok())
        .as_ref()
}

/// The device `id` names (an index or a UUID, as in `CUDA_VISIBLE_DEVICES`).
pub fn device<'n>(nvml: &'n nvml_wrapper::Nvml, id: &str) -> Option<nvml_wrapper::Device<'n>> {
    match id.parse::<u32>() {
        Ok(i) => nvml.device_by_index(i).ok(),
        Err(_) => nvml.device_by_uuid(id).ok(),
    }
}

fn from_nvml() -> Option<Gpus> {
    let nvml = nvml()?;
    let n = nvml.device_count().ok()?;
    let gpus = (0..n)
        .map(|i| {
            let device = nvml.device_by_index(i).ok();
            Gpu {
                id: device
                    .as_ref()
                    .and_then(|d| d.uuid().ok())
                    .unwrap_or_else(|| i.to_string()),
                name: device.as_ref().and_then(|d| d.name().ok()),
            }
        })
        .collect();
    Some(Gpus {
        gpus,
        source: "NVML".into(),
    })
}

fn nvidia_smi() -> Option<Gpus> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(Gpus {
        gpus: parse_smi(&String::from_utf8_lossy(&out.stdout)),
        source: "nvidia-smi".into(),
    })
}

/// `nvidia-smi -L`: `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3c…)` per GPU (MIG
/// instances indented below their GPU are not separate lines starting with `GPU`).
fn parse_smi(text: &str) -> Vec<Gpu> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("GPU ")?;
            let (index, rest) = rest.split_once(": ")?;
            let (name, uuid) = match rest.rsplit_once(" (UUID: ") {
                Some((name, uuid)) => (name, Some(uuid.trim_end_matches(')'))),
                None => (rest, None),
            };
            Some(Gpu {
                id: uuid.unwrap_or(index).to_owned(),
                name: Some(name.to_owned()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_parse() {
        let text =
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d3c0f6e-1b2a-4c3d-9e8f-0a1b2c3d4e5f)\n\
                    GPU 1: Tesla T4 (UUID: GPU-aaaa)\n  MIG 1g.10gb Device 0: (UUID: MIG-x)\n";
        let gpus = parse_smi(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].id, "GPU-5d3c0f6e-1b2a-4c3d-9e8f-0a1b2c3d4e5f");
        assert_eq!(gpus[0].name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(gpus[1].id, "GPU-aaaa");
    }

    #[test]
    fn visible_devices_read_as_cuda_reads_them() {
        assert_eq!(visible_devices("2,3"), ["2", "3"]);
        assert_eq!(visible_devices(" GPU-ab , 1"), ["GPU-ab", "1"]);
        assert_eq!(visible_devices("0,x,1"), ["0"]);
        assert!(visible_devices("").is_empty());
        assert!(visible_devices("-1").is_empty());
        assert!(visible_devices("NoDevFiles").is_empty());
    }
}

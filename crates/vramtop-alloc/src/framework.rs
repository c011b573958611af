//! Which framework holds a process's GPU memory, told from the libraries it has mapped
//! (`/proc/PID/maps`), and each framework's own documented switch for holding less. The
//! process table names it; an OOM whose memory another process held says which and how.
//!
//! The job hook (`vramtop_hook/processes.py`, `FRAMEWORK_MARKERS`) tells frameworks by the same
//! markers at an OOM; a test keeps the two lists the same.

use std::fmt;

/// A framework that allocates GPU memory, as far as its mapped libraries tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Framework {
    /// XLA preallocates 75 % of each GPU it sees when the first array is made.
    Jax,
    /// TensorFlow maps nearly all of each GPU unless told to grow.
    TensorFlow,
    PyTorch,
    CuPy,
    OnnxRuntime,
    TensorRt,
    Paddle,
}

/// Path fragments of mapped files that mark each framework: its own shared objects, as
/// their wheels install them.
pub const MARKERS: [(Framework, &[&str]); 7] = [
    (
        Framework::Jax,
        &[
            "/jaxlib/",
            "/jax_plugins/",
            "xla_cuda_plugin",
            "xla_extension",
        ],
    ),
    (
        Framework::TensorFlow,
        &["libtensorflow_framework", "_pywrap_tensorflow"],
    ),
    (Framework::PyTorch, &["libtorch_cuda", "libc10_cuda"]),
    (Framework::CuPy, &["/cupy/", "/cupy_backends/"]),
    (Framework::OnnxRuntime, &["libonnxruntime_providers_cuda"]),
    (Framework::TensorRt, &["libnvinfer."]),
    (
        Framework::Paddle,
        &["/paddle/base/libpaddle", "libpaddle_inference"],
    ),
];

impl Framework {
    /// Every framework whose marker appears among the mapped paths of `maps` (the text of
    /// `/proc/PID/maps`), in `MARKERS` order, each once.
    pub fn from_maps(maps: &str) -> Vec<Framework> {
        let paths: Vec<&str> = maps
            .lines()
            // address perms offset dev inode path: the path is the rest, spaces and all
            .filter_map(|line| {
                let mut fields = line
                    .splitn(6, char::is_whitespace)
                    .filter(|f| !f.is_empty());
                (0..5).try_for_each(|_| fields.next().map(|_| ()))?;
                fields.next().map(str::trim)
            })
            .filter(|path| path.starts_with('/'))
            .collect();
        MARKERS
            .iter()
            .filter(|(_, marks)| {
                paths
                    .iter()
                    .any(|path| marks.iter().any(|mark| path.contains(mark)))
            })
            .map(|(framework, _)| *framework)
            .collect()
    }

    /// The name as `Display` writes it and the hook sends it, back to the framework.
    pub fn from_name(name: &str) -> Option<Framework> {
        MARKERS
            .iter()
            .map(|(framework, _)| *framework)
            .find(|f| f.name().eq_ignore_ascii_case(name.trim()))
    }

    pub fn name(self) -> &'static str {
        match self {
            Framework::Jax => "JAX/XLA",
            Framework::TensorFlow => "TensorFlow",
            Framework::PyTorch => "PyTorch",
            Framework::CuPy => "CuPy",
            Framework::OnnxRuntime => "ONNX Runtime",
            Framework::TensorRt => "TensorRT",
            Framework::Paddle => "PaddlePaddle",
        }
    }

    /// What that process can do to hold less, in the framework's own documented terms.
    pub fn switch(self) -> &'static str {
        match self {
            Framework::Jax => {
                "XLA preallocates 75 % of the GPU: start it with XLA_PYTHON_CLIENT_PREALLOCATE=false, \
                 or XLA_PYTHON_CLIENT_MEM_FRACTION=.25 for a smaller share"
            }
            Framework::TensorFlow => {
                "TensorFlow maps nearly all of the GPU: start it with TF_FORCE_GPU_ALLOW_GROWTH=true"
            }
            Framework::PyTorch => {
                "its caching allocator keeps freed memory: torch.cuda.empty_cache() there \
                 (vramtop run shows what it holds)"
            }
            Framework::CuPy => {
                "CuPy's memory pool keeps freed blocks: cupy.get_default_memory_pool().free_all_blocks() \
                 there, or set_limit(size=...)"
            }
            Framework::OnnxRuntime => {
                "its CUDA arena keeps what it grew to: gpu_mem_limit, or \
                 arena_extend_strategy=kSameAsRequested, in the CUDA provider's options"
            }
            Framework::TensorRt => "its engines' workspaces: a smaller workspace limit when building them",
            Framework::Paddle => {
                "Paddle preallocates a share of the GPU: FLAGS_fraction_of_gpu_memory_to_use, or \
                 FLAGS_allocator_strategy=auto_growth"
            }
        }
    }
}

impl fmt::Display for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The frameworks as one short label: "JAX/XLA", "PyTorch + CuPy"; "" for none.
pub fn label(frameworks: &[Framework]) -> String {
    frameworks
        .iter()
        .map(|f| f.name())
        .collect::<Vec<_>>()
        .join(" + ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps(paths: &[&str]) -> String {
        paths
            .iter()
            .map(|p| format!("7f0000000000-7f0000001000 r-xp 00000000 08:01 1234  {p}\n"))
            .collect()
    }

    #[test]
    fn jax_is_told_by_its_plugin_and_jaxlib() {
        let text = maps(&[
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/local/lib/python3.12/dist-packages/jaxlib/_jax.so",
            "/usr/local/lib/python3.12/dist-packages/jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        ]);
        assert_eq!(Framework::from_maps(&text), vec![Framework::Jax]);
        // A path with spaces (a venv in "My Projects") is read whole, as the hook reads it.
        let spaced =
            maps(&["/home/a/My Projects/venv/lib/python3.12/site-packages/cupy/_core/core.so"]);
        assert_eq!(Framework::from_maps(&spaced), vec![Framework::CuPy]);
    }

    #[test]
    fn several_frameworks_are_each_named_once() {
        let text = maps(&[
            "/site-packages/torch/lib/libtorch_cuda.so",
            "/site-packages/torch/lib/libc10_cuda.so",
            "/site-packages/cupy/_core/core.cpython-312-x86_64-linux-gnu.so",
        ]);
        let found = Framework::from_maps(&text);
        assert_eq!(found, vec![Framework::PyTorch, Framework::CuPy]);
        assert_eq!(label(&found), "PyTorch + CuPy");
    }

    #[test]
    fn anonymous_mappings_and_plain_processes_name_none() {
        let text = "7f00-7f10 rw-p 00000000 00:00 0 \n7f10-7f20 rw-p 00000000 00:00 0  [heap]\n";
        assert!(Framework::from_maps(text).is_empty());
        assert!(Framework::from_maps(&maps(&["/usr/bin/python3.12"])).is_empty());
    }

    #[test]
    fn names_read_back() {
        for (framework, _) in MARKERS {
            assert_eq!(Framework::from_name(framework.name()), Some(framework));
        }
        assert_eq!(Framework::from_name("jax/xla"), Some(Framework::Jax));
        assert_eq!(Framework::from_name("Fortran"), None);
    }
}

//! Which container, Kubernetes pod or systemd unit a process belongs to, read from the
//! lines of /proc/PID/cgroup (cgroup v1 and v2, systemd and cgroupfs drivers). Pure
//! parsing of the path names that Docker, containerd, CRI-O, Podman, the kubelet and
//! systemd write; no I/O here beyond what the caller reads.

use serde::{Deserialize, Serialize};

/// Where a process sits: a container (and its pod), or a systemd unit and slice.
/// Every part is optional: a process in the root cgroup, or behind a cgroup namespace
/// (which shows "/" to the reader), has none.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupOrigin {
    /// docker, containerd, cri-o, podman, or "container" when only the id is known
    /// (the kubelet's cgroupfs driver names no runtime).
    pub runtime: Option<String>,
    pub container_id: Option<String>,
    /// Kubernetes pod UID, dashed as `kubectl get pod -o jsonpath={.metadata.uid}` shows it.
    pub pod_uid: Option<String>,
    /// The innermost systemd unit (ssh.service, session-3.scope, user@1000.service),
    /// left out when the unit is only a container's scope.
    pub unit: Option<String>,
    /// The innermost systemd slice (system.slice, user-1000.slice).
    pub slice: Option<String>,
}

/// Characters of a container id or pod UID shown in a table cell, as `docker ps` does.
const SHORT_ID: usize = 12;

impl CgroupOrigin {
    /// A short cell for the process table: `pod 1a2b3c4d-5e6f`, `docker 0123456789ab`,
    /// `ssh.service`, or the slice when nothing narrower is known.
    pub fn label(&self) -> Option<String> {
        if let Some(pod) = &self.pod_uid {
            return Some(format!("pod {}", short(pod)));
        }
        if let Some(id) = &self.container_id {
            let runtime = self.runtime.as_deref().unwrap_or("container");
            return Some(format!("{runtime} {}", short(id)));
        }
        self.unit.clone().or_else(|| self.slice.clone())
    }

    fn is_empty(&self) -> bool {
        *self == CgroupOrigin::default()
    }
}

fn short(id: &str) -> &str {
    id.get(..SHORT_ID).unwrap_or(id)
}

/// The origin of a process from the whole text of /proc/PID/cgroup, or None when it says
/// nothing (root cgroup, a cgroup namespace). A container found on any v1 hierarchy wins;
/// units and slices come from the v2 line (`0::`) or v1's `name=systemd` hierarchy.
pub fn parse_proc_cgroup(text: &str) -> Option<CgroupOrigin> {
    let mut best: Option<CgroupOrigin> = None;
    for line in text.lines() {
        // hierarchy-id:controllers:path; the path may itself hold ':'.
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let systemd_view = controllers.is_empty() || controllers == "name=systemd";
        let mut origin = parse_cgroup_path(path);
        if !systemd_view {
            // Controller hierarchies (v1 memory, pids...) are named by the runtime, not by
            // systemd: take their container, never their unit.
            origin.unit = None;
            origin.slice = None;
        }
        best = Some(match best {
            None => origin,
            Some(so_far) => merge(so_far, origin),
        });
    }
    best.filter(|o| !o.is_empty())
}

/// Fill what `a` lacks from `b`.
fn merge(a: CgroupOrigin, b: CgroupOrigin) -> CgroupOrigin {
    let container = a.container_id.is_some();
    CgroupOrigin {
        runtime: if container {
            a.runtime
        } else {
            a.runtime.or(b.runtime)
        },
        container_id: a.container_id.or(b.container_id),
        pod_uid: a.pod_uid.or(b.pod_uid),
        unit: a.unit.or(b.unit),
        slice: a.slice.or(b.slice),
    }
}

/// One cgroup path, e.g.
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`
/// or `/docker/<id>` or `/user.slice/user-1000.slice/session-3.scope`.
pub fn parse_cgroup_path(path: &str) -> CgroupOrigin {
    let mut origin = CgroupOrigin::default();
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    for (i, component) in components.iter().enumerate() {
        if let Some((runtime, id)) = container_scope(component) {
            origin.runtime = Some(runtime.to_string());
            origin.container_id = Some(id.to_string());
        } else if let Some(uid) = pod_uid(component) {
            origin.pod_uid = Some(uid);
        } else if is_hex_id(component) && origin.container_id.is_none() {
            // cgroupfs drivers: /docker/<id>, /kubepods/burstable/pod<uid>/<id>.
            let runtime = match i.checked_sub(1).map(|j| components[j]) {
                Some("docker") => "docker",
                Some("lxc") => "lxc",
                _ => "container",
            };
            origin.runtime = Some(runtime.to_string());
            origin.container_id = Some(component.to_string());
        } else if component.ends_with(".service") || component.ends_with(".scope") {
            origin.unit = Some(component.to_string());
        } else if component.ends_with(".slice") && !component.starts_with("kubepods") {
            origin.slice = Some(component.to_string());
        }
    }
    origin
}

/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`
/// (systemd driver), as (runtime, id).
fn container_scope(component: &str) -> Option<(&'static str, &str)> {
    const PREFIXES: &[(&str, &str)] = &[
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
    ];
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    PREFIXES.iter().find_map(|&(prefix, runtime)| {
        let id = stem.strip_prefix(prefix)?;
        is_hex_id(id).then_some((runtime, id))
    })
}

/// The pod UID of `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice`
/// (systemd driver, where the kubelet turns the UID's dashes into underscores).
fn pod_uid(component: &str) -> Option<String> {
    let stem = component.strip_suffix(".slice").unwrap_or(component);
    let start = stem.rfind("pod")?;
    let before = &stem[..start];
    if !(before.is_empty() || before.starts_with("kubepods")) {
        return None;
    }
    let uid = stem[start + 3..].replace('_', "-");
    let uid_like = uid.len() >= 32
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && uid.chars().filter(|c| c.is_ascii_hexdigit()).count() == 32;
    uid_like.then_some(uid)
}

/// A container id: 64 hex digits from Docker and containerd; accept 32 and up so that
/// truncated or other runtimes' ids still count, but not short words like "cafe".
fn is_hex_id(s: &str) -> bool {
    s.len() >= 32 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";
    const POD: &str = "0f3c2a44-9b1e-4d2a-8c6b-5e7f8a9b0c1d";

    fn parsed(text: &str) -> CgroupOrigin {
        parse_proc_cgroup(text).unwrap_or_else(|| panic!("no origin in {text:?}"))
    }

    #[test]
    fn docker_on_cgroup_v2_with_the_systemd_driver() {
        let o = parsed(&format!("0::/system.slice/docker-{ID}.scope\n"));
        assert_eq!(o.runtime.as_deref(), Some("docker"));
        assert_eq!(o.container_id.as_deref(), Some(ID));
        assert_eq!(o.unit, None, "a container's scope is not its unit");
        assert_eq!(o.label().as_deref(), Some("docker 3f2a1b2c4d5e"));
    }

    #[test]
    fn docker_on_cgroup_v1_with_the_cgroupfs_driver() {
        let text = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n\
             1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        let o = parsed(&text);
        assert_eq!(o.runtime.as_deref(), Some("docker"));
        assert_eq!(o.container_id.as_deref(), Some(ID));
    }

    #[test]
    fn kubernetes_pod_with_containerd_on_cgroup_v2() {
        let under = POD.replace('-', "_");
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/\
             cri-containerd-{ID}.scope\n"
        );
        let o = parsed(&text);
        assert_eq!(o.pod_uid.as_deref(), Some(POD));
        assert_eq!(o.runtime.as_deref(), Some("containerd"));
        assert_eq!(o.container_id.as_deref(), Some(ID));
        assert_eq!(o.slice, None, "kubepods slices are the pod's, not a unit's");
        assert_eq!(o.label().as_deref(), Some("pod 0f3c2a44-9b1"));
    }

    #[test]
    fn kubernetes_pod_on_cgroup_v1_with_the_cgroupfs_driver() {
        let text = format!(
            "11:memory:/kubepods/besteffort/pod{POD}/{ID}\n\
             4:devices:/kubepods/besteffort/pod{POD}/{ID}\n"
        );
        let o = parsed(&text);
        assert_eq!(o.pod_uid.as_deref(), Some(POD));
        assert_eq!(o.container_id.as_deref(), Some(ID));
        assert_eq!(o.runtime.as_deref(), Some("container"));
    }

    #[test]
    fn cri_o_and_podman_scopes() {
        let crio = parsed(&format!("0::/kubepods.slice/crio-{ID}.scope"));
        assert_eq!(crio.runtime.as_deref(), Some("cri-o"));
        let podman = parsed(&format!(
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
        ));
        assert_eq!(podman.runtime.as_deref(), Some("podman"));
        assert_eq!(podman.unit.as_deref(), Some("user@1000.service"));
    }

    #[test]
    fn systemd_service_and_login_session() {
        let service = parsed("0::/system.slice/ollama.service\n");
        assert_eq!(service.unit.as_deref(), Some("ollama.service"));
        assert_eq!(service.slice.as_deref(), Some("system.slice"));
        assert_eq!(service.label().as_deref(), Some("ollama.service"));
        let session = parsed("0::/user.slice/user-1000.slice/session-3.scope\n");
        assert_eq!(session.unit.as_deref(), Some("session-3.scope"));
        assert_eq!(session.slice.as_deref(), Some("user-1000.slice"));
    }

    #[test]
    fn v1_units_come_from_the_systemd_hierarchy_only() {
        let text = "12:memory:/user.slice\n1:name=systemd:/system.slice/slurmd.service\n";
        let o = parsed(text);
        assert_eq!(o.unit.as_deref(), Some("slurmd.service"));
        assert_eq!(o.slice.as_deref(), Some("system.slice"));
    }

    #[test]
    fn root_and_namespaced_cgroups_say_nothing() {
        assert_eq!(parse_proc_cgroup("0::/\n"), None);
        assert_eq!(parse_proc_cgroup(""), None);
        assert_eq!(parse_proc_cgroup("garbage without colons"), None);
    }

    #[test]
    fn short_hex_words_are_not_container_ids() {
        let o = parse_cgroup_path("/system.slice/cafe.service");
        assert_eq!(o.container_id, None);
        assert_eq!(pod_uid("podcast.slice"), None);
    }
}

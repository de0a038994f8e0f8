//! The control service's decisions, apart from Envoy: when to ask the admin API for a
//! newer ruleset and what to make of its answer ([`follow`]), when to send the workers'
//! statistics and what to keep when the admin API cannot take them ([`reports`]), and the
//! sync of fleet-wide buckets ([`global`]); which root context runs the service
//! ([`election`]: a lease in shared data, for Envoys without a singleton); and noticing
//! that the admin API's cluster is missing ([`AdminClusterWatch`]).
//!
//! Each is a state machine with time passed in (ns since the Unix epoch) and HTTP answers
//! passed in as [`Answer`]s; each returns what to send and what happened, and the filter's
//! control service (`filter/src/control.rs`) only carries that to and from the host:
//! dispatching calls, reading shared data, publishing, logging and counting.

pub mod election;
pub mod follow;
pub mod global;
mod problem;
pub mod reports;

/// An answer to one HTTP call to the admin API, as the host gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer<'a> {
    /// `None`: the call failed (no connection, timed out, reset).
    pub status: Option<u16>,
    pub body: Option<&'a [u8]>,
}

impl<'a> Answer<'a> {
    pub const NONE: Answer<'static> = Answer {
        status: None,
        body: None,
    };

    pub fn new(status: Option<u16>, body: Option<&'a [u8]>) -> Self {
        Answer { status, body }
    }
}

/// Longest text the control service puts in a header to the admin API.
pub const MAX_HEADER_TEXT: usize = 300;

/// Header values must be visible ASCII: anything else becomes `?`, and long texts are cut
/// to [`MAX_HEADER_TEXT`] characters.
pub fn header_safe(text: &str) -> String {
    text.chars()
        .take(MAX_HEADER_TEXT)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// Whether Envoy knows the admin API's cluster, from how it answers the control service's
/// calls. Envoy refuses a call to a cluster it does not have at once (proxy-wasm's
/// `BadArgument`, verified with Envoy 1.40), without any request going out; under a
/// control plane that names the cluster (Istio's `outbound|PORT||HOST`) a typo or a
/// missing `ServiceEntry` looks exactly like that. The watch turns a stream of calls into
/// changes, so the operator is told once, not on every tick.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminClusterWatch {
    missing: bool,
}

/// What changed about the admin API's cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterChange {
    /// Calls started being refused: the cluster does not exist.
    Missing,
    /// A call went out again after being refused: the cluster exists now.
    Found,
}

impl AdminClusterWatch {
    /// Records one call: `cluster_missing` when the host refused it for naming no cluster.
    /// Returns a change worth logging, at most once per change.
    pub fn called(&mut self, cluster_missing: bool) -> Option<ClusterChange> {
        let was = std::mem::replace(&mut self.missing, cluster_missing);
        match (was, cluster_missing) {
            (false, true) => Some(ClusterChange::Missing),
            (true, false) => Some(ClusterChange::Found),
            _ => None,
        }
    }

    pub fn is_missing(&self) -> bool {
        self.missing
    }
}

/// What the operator reads when the admin API's cluster does not exist: its name, and
/// what to create.
pub fn missing_cluster_message(cluster: &str) -> String {
    format!(
        "Envoy has no cluster named `{cluster}` (control.admin_cluster), so the control \
         service cannot reach the admin API: create it, or name an existing one (Istio: a \
         ServiceEntry or Service for the admin API, whose cluster is \
         `outbound|PORT||HOST`; Envoy Gateway: a Backend; plain Envoy: a static cluster, as \
         `sluice envoy-config --control worker` writes). Rules stay as they are and traffic \
         keeps flowing meanwhile"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_text_is_visible_ascii_and_bounded() {
        assert_eq!(header_safe("bad\nrule é"), "bad?rule ?");
        assert_eq!(header_safe(&"x".repeat(1000)).len(), MAX_HEADER_TEXT);
    }

    #[test]
    fn a_missing_cluster_is_told_once_per_change() {
        let mut watch = AdminClusterWatch::default();
        assert_eq!(watch.called(false), None);
        assert_eq!(watch.called(true), Some(ClusterChange::Missing));
        assert!(watch.is_missing());
        assert_eq!(watch.called(true), None);
        assert_eq!(watch.called(true), None);
        assert_eq!(watch.called(false), Some(ClusterChange::Found));
        assert_eq!(watch.called(false), None);
        assert_eq!(watch.called(true), Some(ClusterChange::Missing));
        let message =
            missing_cluster_message("outbound|8080||sluice-admin.sluice.svc.cluster.local");
        assert!(
            message.contains(
                "no cluster named `outbound|8080||sluice-admin.sluice.svc.cluster.local`"
            ),
            "{message}"
        );
        assert!(message.contains("ServiceEntry"), "{message}");
    }
}

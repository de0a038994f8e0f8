//! `sluice render`: what users apply on their platforms, as YAML.
//!
//! * [`istio`]: a `WasmPlugin` (`extensions.istio.io/v1alpha1`) whose plugin configuration
//!   carries the `control` section, so the workers elect one of themselves to follow the
//!   admin API through Istio's own outbound cluster for it; for an admin API outside the
//!   mesh, the `ServiceEntry` (and, over https, the `DestinationRule`) that makes that
//!   cluster exist.
//! * [`envoy_gateway`]: an `EnvoyExtensionPolicy` (`gateway.envoyproxy.io/v1alpha1`) with
//!   the filter as a `wasm` entry, and an `EnvoyPatchPolicy` that adds the admin API's
//!   cluster, since Envoy Gateway names no cluster a wasm module could call otherwise.
//! * [`envoy`]: the `http_filters` entry and the admin cluster, for users who write their
//!   own Envoy configuration; both are what [`crate::build`] puts in a full bootstrap.
//! * [`kubernetes`]: the admin API's own manifests (Deployment, Service, storage), the
//!   kustomize base committed in `deploy/kubernetes/`.
//! * [`ratelimit`]: no wasm: Envoy's native rate limit (and quota) filter asking Sluice's
//!   gRPC listener, its cluster and the route's `rate_limits`, for users who write their
//!   own Envoy configuration; made by the same functions as `envoy-config --rls`.
//!
//! Pure, like the rest of the crate: the CLI reads rules, token and module files and
//! passes their contents in. Secrets are never invented: the proxy token is the caller's
//! or [`TOKEN_PLACEHOLDER`], and the admin API's manifests only name the Secrets the
//! operator creates.
//!
//! What they share: `resources` (the YAML documents under their comment header,
//! Kubernetes names and metadata, policy targets, [`RenderError`]) and `follow` (how the
//! elected worker follows the admin API: the proxy token and the plugin configuration's
//! `control` section).

mod envoy;
mod envoy_gateway;
mod follow;
mod istio;
mod kubernetes;
mod ratelimit;
mod resources;

pub use envoy::{EnvoyOptions, envoy};
pub use envoy_gateway::{EnvoyGatewayOptions, envoy_gateway};
pub use follow::{Follow, ProxyToken, TOKEN_PLACEHOLDER};
pub use istio::{IstioAdmin, IstioOptions, IstioPhase, istio, istio_cluster};
pub use kubernetes::{
    ADMIN_NAMESPACE, ADMIN_PORT, ADMIN_PORT_NAME, ADMIN_SERVICE, ADMIN_TOKEN_SECRET, AdminService,
    DATA_DIR, DATABASE_SECRET, Database, KubernetesOptions, REDIS_SECRET, RUN_AS, SECRET_KEY_TOKEN,
    SECRET_KEY_URL, default_admin_image, kubernetes, kubernetes_stream,
};
pub use ratelimit::{RatelimitOptions, ratelimit};
pub use resources::{RenderError, Rendered, TargetRef, default_filter_image};

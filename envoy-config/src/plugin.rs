//! The filter as Envoy loads it: the `envoy.filters.http.wasm` entry, the VM it runs in
//! (shared with the control service), and its plugin configuration, checked as the filter
//! will check it.

use std::path::Path;

use serde_json::{Value, json};
use sluice_core::config::{FilterConfig, FilterConfigSpec};

use crate::error::{EnvoyConfigError, field_errors};
use crate::options::{ControlMode, EnvoyConfigOptions, PluginConfig};

/// Envoy's name for the wasm HTTP filter in `http_filters`.
pub const WASM_FILTER: &str = "envoy.filters.http.wasm";
/// Plugin name, root id and VM id. The later singleton service must use the same `vm_id`
/// to share the filter's shared data.
pub const PLUGIN_NAME: &str = "sluice";

/// The VM the filter runs in. The filter and the control service must share one VM
/// configuration: shared data (where the control service publishes rulesets) is per
/// `vm_id`, and identical `vm_config`s let Envoy reuse one loaded module.
pub(crate) fn vm_config(filter_wasm: &Path) -> Value {
    json!({
        "vm_id": PLUGIN_NAME,
        "runtime": "envoy.wasm.runtime.v8",
        "code": { "local": { "filename": filter_wasm.to_string_lossy() } },
    })
}

/// The `envoy.filters.http.wasm` entry of an `http_filters` list, failing open.
pub(crate) fn wasm_filter(vm_config: Value, plugin_json: String) -> Value {
    json!({
        "name": WASM_FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": PLUGIN_NAME,
                "root_id": PLUGIN_NAME,
                "vm_config": vm_config,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": plugin_json,
                },
                "failure_policy": "FAIL_OPEN",
            },
        },
    })
}

/// The filter's plugin configuration, as the `configuration` string of the
/// `envoy.filters.http.wasm` entry: validated as the filter will validate it. In
/// [`ControlMode::Worker`] with an admin API it carries the `control` section (the admin
/// API's cluster, authority, proxy token and intervals), so it is all a control plane that
/// loads Sluice as a plain HTTP filter (Istio's `WasmPlugin.pluginConfig`, Envoy Gateway's
/// `EnvoyExtensionPolicy`) needs besides a route to the admin API. A
/// [`PluginConfig::Raw`] is returned verbatim.
pub fn plugin_configuration(options: &EnvoyConfigOptions) -> Result<String, EnvoyConfigError> {
    match (&options.plugin, &options.admin, options.control_mode) {
        (PluginConfig::Spec(spec), Some(admin), ControlMode::Worker) => {
            let spec = FilterConfigSpec {
                control: Some(admin.control_spec()?),
                ..spec.clone()
            };
            plugin_json(&PluginConfig::Spec(spec))
        }
        (plugin, _, _) => plugin_json(plugin),
    }
}

fn plugin_json(plugin: &PluginConfig) -> Result<String, EnvoyConfigError> {
    match plugin {
        PluginConfig::Raw(raw) => Ok(raw.clone()),
        PluginConfig::Spec(spec) => {
            FilterConfig::try_from(spec.clone())
                .map_err(|e| EnvoyConfigError::InvalidFilterConfig(field_errors(e)))?;
            // Pretty-printed, it becomes a readable block in the YAML; the filter does not mind.
            serde_json::to_string_pretty(spec)
                .map_err(|e| EnvoyConfigError::Serialise(e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::spec::FailureMode;
    use sluice_rules_file::RulesFormat;

    use super::*;
    use crate::testing::*;
    use crate::{ADMIN_CLUSTER, Upstream, build, render};

    #[test]
    fn the_plugin_configuration_is_embedded_as_a_json_string() {
        let mut opts = options(Upstream::Direct);
        let spec = FilterConfigSpec {
            slots: 1024,
            failure_mode: FailureMode::Closed,
            ..example_rules()
        };
        opts.plugin = PluginConfig::Spec(spec.clone());
        let config = parse(&render(&opts).unwrap());
        let wasm = wasm_config(&config);
        assert_eq!(
            wasm["configuration"]["@type"],
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let embedded = wasm["configuration"]["value"].as_str().unwrap();
        let round_trip: FilterConfigSpec = serde_json::from_str(embedded).unwrap();
        assert_eq!(round_trip, spec);
        // The filter parses exactly these bytes at start-up.
        let parsed = FilterConfig::from_json(embedded.as_bytes()).unwrap();
        assert_eq!(parsed.table.slots(), 1024);
        assert_eq!(wasm["failure_policy"], "FAIL_OPEN");
        assert_eq!(wasm["root_id"], PLUGIN_NAME);
        assert_eq!(wasm["vm_config"]["vm_id"], PLUGIN_NAME);
        assert_eq!(wasm["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    }

    #[test]
    fn the_filter_is_loaded_from_the_absolute_path() {
        let config = parse(&render(&options(Upstream::Direct)).unwrap());
        assert_eq!(
            wasm_config(&config)["vm_config"]["code"]["local"]["filename"],
            WASM
        );
    }

    #[test]
    fn invalid_rules_are_refused_with_every_field_named() {
        let mut opts = options(Upstream::Direct);
        opts.plugin = PluginConfig::Spec(FilterConfigSpec {
            slots: 3,
            ..filter_spec(
                "
- name: a
  key: global
  limits: [{requests: 0, period: second}]
- name: b
  key: global
  limits: [{requests: 1, period: 0}]
- name: c
  key: global
  limits: [{requests: 1, period: minute}]
- name: c
  key: {header: x-api-key}
  limits: [{requests: 1, period: minute}]
",
                RulesFormat::Yaml,
            )
        });
        let Err(EnvoyConfigError::InvalidFilterConfig(errors)) = render(&opts) else {
            panic!("invalid rules were accepted");
        };
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "slots",
                "rules[0].limits[0].requests",
                "rules[1].limits[0].period",
                "rules[3].name",
                "rules[3].id"
            ]
        );
    }

    #[test]
    fn a_raw_plugin_configuration_is_embedded_unchecked() {
        let mut opts = options(Upstream::Direct);
        opts.plugin = PluginConfig::Raw("{not json".to_string());
        let config = parse(&render(&opts).unwrap());
        assert_eq!(wasm_config(&config)["configuration"]["value"], "{not json");
    }

    #[test]
    fn worker_mode_puts_the_control_section_in_the_plugin_configuration_and_no_singleton() {
        let mut opts = with_admin("http://127.0.0.1:8080");
        opts.plugin = PluginConfig::Spec(example_rules());
        opts.control_mode = ControlMode::Worker;
        let yaml = render(&opts).unwrap();
        let config = parse(&yaml);
        assert!(
            config.get("bootstrap_extensions").is_none(),
            "no bootstrap extension: {yaml}"
        );
        // The admin API's cluster stays, as a control plane would provide it.
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[1]["name"], ADMIN_CLUSTER);
        // The filter parses exactly these bytes: rules and the control section.
        let embedded = embedded_plugin(&config);
        let parsed = FilterConfig::from_json(embedded.as_bytes()).unwrap();
        assert_eq!(parsed.ruleset.rules().len(), 1);
        let control = parsed.control.unwrap();
        assert_eq!(control.admin_cluster, ADMIN_CLUSTER);
        assert_eq!(control.admin_authority, "127.0.0.1:8080");
        assert_eq!(control.token, "slc_proxy_token");
        assert_eq!(control.proxy_id.as_deref(), Some("envoy-1"));
        assert_eq!(plugin_configuration(&opts).unwrap(), embedded);
        assert!(
            yaml.contains("# Control service: run by one worker elected"),
            "{yaml}"
        );

        // The default is today's singleton, with no control section in the filter's.
        opts.control_mode = ControlMode::default();
        let config = parse(&render(&opts).unwrap());
        assert_eq!(
            config["bootstrap_extensions"][0]["name"],
            "envoy.bootstrap.wasm"
        );
        let embedded = embedded_plugin(&config);
        assert!(
            FilterConfig::from_json(embedded.as_bytes())
                .unwrap()
                .control
                .is_none()
        );
    }

    #[test]
    fn worker_mode_names_the_platforms_cluster_and_checks_the_connection() {
        let istio = "outbound|8080||sluice-admin.sluice.svc.cluster.local";
        let mut opts = with_admin("http://127.0.0.1:8080");
        opts.control_mode = ControlMode::Worker;
        opts.admin.as_mut().unwrap().cluster = istio.to_string();
        let json = plugin_configuration(&opts).unwrap();
        let spec: FilterConfigSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(spec.control.unwrap().admin_cluster, istio);
        let config = build(&opts).unwrap().config;
        assert_eq!(config["static_resources"]["clusters"][1]["name"], istio);

        // What the control service would refuse is refused here.
        opts.admin.as_mut().unwrap().token.clear();
        let Err(EnvoyConfigError::InvalidControlConfig(errors)) = plugin_configuration(&opts)
        else {
            panic!("an empty token was accepted");
        };
        assert_eq!(errors.0[0].field, "token");
        // And so are the transport rules.
        let mut remote = with_admin("http://10.0.0.9:8080");
        remote.control_mode = ControlMode::Worker;
        assert!(matches!(
            build(&remote),
            Err(EnvoyConfigError::PlainHttpToRemote(_))
        ));
        // Without an admin API worker mode changes nothing; a raw configuration is the
        // caller's own.
        let mut plain = options(Upstream::Direct);
        plain.control_mode = ControlMode::Worker;
        assert!(!plugin_configuration(&plain).unwrap().contains("control"));
        let mut raw = with_admin("http://127.0.0.1:8080");
        raw.control_mode = ControlMode::Worker;
        raw.plugin = PluginConfig::Raw("{}".to_string());
        assert_eq!(plugin_configuration(&raw).unwrap(), "{}");
    }
}

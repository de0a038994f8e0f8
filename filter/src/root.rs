//! The root context: one per worker VM. It owns what every request of that worker
//! shares: the validated configuration, the metrics and the shared-data store.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};
use sluice_core::config::FilterConfig;

use crate::host_store::HostStore;
use crate::http::SluiceHttp;
use crate::metrics::Metrics;

/// State shared by the root context and its request contexts (one VM, one thread).
#[derive(Debug, Default)]
pub struct Shared {
    /// The configuration in force; `None` until a valid one arrives. Replaced whole, so
    /// a request keeps the `Rc` it started with.
    config: RefCell<Option<Rc<FilterConfig>>>,
    pub metrics: RefCell<Metrics>,
    pub store: HostStore,
}

impl Shared {
    pub fn config(&self) -> Option<Rc<FilterConfig>> {
        self.config.borrow().clone()
    }

    pub fn metrics(&self) -> Metrics {
        *self.metrics.borrow()
    }
}

#[derive(Debug, Default)]
pub struct SluiceRoot {
    shared: Rc<Shared>,
    metrics_defined: bool,
}

impl Context for SluiceRoot {}

impl RootContext for SluiceRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        if !self.metrics_defined {
            *self.shared.metrics.borrow_mut() = Metrics::define();
            self.metrics_defined = true;
        }
        let bytes = match hostcalls::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        ) {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(status) => {
                log::error!(
                    "cannot read the plugin configuration ({status:?}); passing all traffic"
                );
                self.shared.metrics().config_errors.inc();
                return true;
            }
        };
        match FilterConfig::from_json(&bytes) {
            Ok(config) => {
                log::info!(
                    "configured with {} rule(s), {} bucket slots",
                    config.ruleset.rules().len(),
                    config.table.slots()
                );
                *self.shared.config.borrow_mut() = Some(Rc::new(config));
            }
            Err(error) => {
                // A bad configuration must never take traffic down: keep the last good
                // one if there is one, otherwise pass everything, and say so loudly.
                let kept = if self.shared.config().is_some() {
                    "keeping the previous configuration"
                } else {
                    "passing all traffic"
                };
                log::error!("{error}; {kept}");
                self.shared.metrics().config_errors.inc();
            }
        }
        // Returning false would make Envoy reject the listener or fail the VM; Sluice
        // reports the problem in the log and metrics and keeps traffic flowing instead.
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(SluiceHttp::new(Rc::clone(&self.shared))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

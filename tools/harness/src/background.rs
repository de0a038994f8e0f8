//! A tokio runtime on a thread of its own, stopped when dropped: for the servers and
//! clients that tests and tools start from plain blocking code (`#[test]`, the benchmark's
//! threads) as well as from async code.

use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// A current-thread runtime: one thread is plenty for loopback HTTP/1.1 and leaves the
/// other cores to Envoy, which is what is measured. Its tasks are cancelled when it is
/// dropped.
#[derive(Debug)]
pub struct Background {
    handle: Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Background {
    /// Starts the runtime on a thread named `name`.
    pub fn start(name: &str) -> Result<Background> {
        let (handle_tx, handle_rx) = mpsc::channel();
        let (shutdown, stop) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = handle_tx.send(Ok(runtime.handle().clone()));
                        let _ = runtime.block_on(stop);
                    }
                    Err(err) => {
                        let _ = handle_tx.send(Err(err));
                    }
                }
            })
            .with_context(|| format!("starting the thread {name}"))?;
        let handle = handle_rx
            .recv()
            .map_err(|_| anyhow!("the thread {name} ended before its runtime started"))?
            .with_context(|| format!("starting the runtime of {name}"))?;
        Ok(Background {
            handle,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// Runs `future` on the runtime in the background.
    pub fn spawn<F>(&self, future: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.handle.spawn(future));
    }

    /// Runs `future` on the runtime and waits for it, at most `limit`: a backstop for a
    /// future that bounds itself.
    pub fn block_on<F, T>(&self, future: F, limit: Duration) -> Result<T>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, result) = mpsc::channel();
        self.handle.spawn(async move {
            let _ = reply.send(future.await);
        });
        result.recv_timeout(limit).map_err(|err| {
            anyhow!(
                "the work did not finish within {} s: {err}",
                limit.as_secs()
            )
        })
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

//! TCP→Unix bridges for egress: listen on a loopback address inside the unit,
//! forward each connection's bytes both ways to a Unix socket (the host's
//! egress proxy). No policy: any process in the unit can reach the Unix socket
//! directly anyway, so the host judges what arrives.

use tokio::net::{TcpListener, UnixStream};

use crate::config::Bridge;

/// Binds every bridge's listener (so a failure stops the init before the
/// executor starts, and tools find the port ready), then serves them.
pub(crate) fn start(bridges: &[Bridge]) -> std::io::Result<()> {
    for bridge in bridges {
        let listener = std::net::TcpListener::bind(bridge.listen).map_err(|error| {
            std::io::Error::new(
                error.kind(),
                format!(
                    "bridge {} → {}: {error}",
                    bridge.listen,
                    bridge.target.display()
                ),
            )
        })?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        tokio::spawn(serve(listener, bridge.clone()));
    }
    Ok(())
}

async fn serve(listener: TcpListener, bridge: Bridge) {
    loop {
        match listener.accept().await {
            Ok((mut tcp, _)) => {
                let target = bridge.target.clone();
                tokio::spawn(async move {
                    match UnixStream::connect(&target).await {
                        Ok(mut unix) => {
                            if let Err(error) =
                                tokio::io::copy_bidirectional(&mut tcp, &mut unix).await
                            {
                                tracing::debug!(%error, target = %target.display(), "bridged connection ended");
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, target = %target.display(), "bridge cannot reach its Unix socket");
                        }
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, listen = %bridge.listen, "bridge accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

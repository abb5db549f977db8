//! Serving the API over TLS (rustls): a listener that accepts TCP connections and hands
//! axum the ones whose handshake completed. Handshakes run concurrently, each with a
//! deadline, so one slow or silent client holds up nobody else.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// The server's TLS settings from a PEM certificate chain and its PEM private key.
pub fn tls_config(cert: &Path, key: &Path) -> io::Result<Arc<ServerConfig>> {
    let invalid = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} {}: {e}", path.display()),
        )
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| invalid("cannot read the certificate", cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("cannot read the certificate", cert, &e))?;
    if chain.is_empty() {
        return Err(invalid("no certificate in", cert, &"expected PEM"));
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| invalid("cannot read the private key", key, &e))?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| invalid("the certificate and key do not go together:", cert, &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Connections whose TLS handshake completed, for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(64);
        let acceptor = TlsAcceptor::from(config);
        tokio::spawn(async move {
            loop {
                // Stop (and free the port) once the server stops taking connections.
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = tx.closed() => return,
                };
                let (tcp, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_DEADLINE, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The peer of a request, over TCP or TLS: what the audit trail records as its source,
/// and whether it came over TLS (the console's cookie is then `Secure`).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr, pub bool);

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Peer {
        Peer(*stream.remote_addr(), false)
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Peer {
        Peer(*stream.remote_addr(), true)
    }
}

//! Both sides of a connection's opening (see [`crate::protocol`] for the
//! exchange): [`init_side`] for the init, which connects, and [`host_side`] for
//! the host, which accepts. Each returns the stream split in two, with the
//! line reader keeping whatever arrived after the handshake.

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::line::{LineEvent, LineReader};
use crate::protocol::{
    self, HostMessage, InitMessage, InitState, MAX_HANDSHAKE_LINE_BYTES, MAX_LINE_BYTES, Nonce,
    PROTOCOL_VERSION, Role, UnitKey,
};

/// A connection after a successful handshake.
#[derive(Debug)]
pub struct Established {
    /// Lines from the peer (anything sent right after the handshake is
    /// already buffered here).
    pub reader: LineReader<OwnedReadHalf>,
    /// The write half.
    pub writer: OwnedWriteHalf,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Reading or writing the socket failed.
    #[error("socket error during the handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The peer hung up before the handshake finished.
    #[error("the peer hung up during the handshake")]
    Closed,
    /// A line that is not the control message expected at this step.
    #[error("expected {expected} during the handshake, got something else")]
    Unexpected {
        /// The message expected.
        expected: &'static str,
    },
    /// The init speaks another protocol version.
    #[error("the init speaks protocol version {got}, this host speaks {PROTOCOL_VERSION}")]
    Version {
        /// The version announced.
        got: u32,
    },
    /// The hello names another unit than the one expected on this socket.
    #[error("the connection claims to be unit {claimed:?}, this socket belongs to another unit")]
    WrongUnit {
        /// The unit claimed.
        claimed: String,
    },
    /// A nonce that is not 64 hex digits.
    #[error("the peer's nonce is not 64 hex digits")]
    BadNonce,
    /// The peer's proof does not verify under the unit key: it does not hold
    /// the key (an impostor), or the keys differ.
    #[error("the {0}'s proof does not verify under the unit key")]
    BadProof(Role),
}

/// The init's side: announce, check the host's proof, prove (with `state()`,
/// taken then, since a connection may wait in the host's backlog for a while),
/// await welcome.
pub async fn init_side(
    stream: UnixStream,
    key: &UnitKey,
    unit: &str,
    state: impl FnOnce() -> InitState,
) -> Result<Established, HandshakeError> {
    let (read, mut writer) = stream.into_split();
    let mut reader = LineReader::new(read, MAX_HANDSHAKE_LINE_BYTES);
    let nonce = Nonce::generate();
    let hello = InitMessage::Hello {
        version: PROTOCOL_VERSION,
        unit: unit.to_owned(),
        nonce: nonce.to_hex(),
    };
    writer.write_all(&protocol::encode_control(&hello)).await?;
    let HostMessage::Challenge {
        nonce: host_nonce,
        proof,
    } = read_control(&mut reader, "challenge").await?
    else {
        return Err(HandshakeError::Unexpected {
            expected: "challenge",
        });
    };
    if !key.verify(Role::Host, &nonce, unit, &proof) {
        return Err(HandshakeError::BadProof(Role::Host));
    }
    let host_nonce = Nonce::from_hex(&host_nonce).ok_or(HandshakeError::BadNonce)?;
    let proof = InitMessage::Proof {
        mac: key.prove(Role::Init, &host_nonce, unit),
        state: state(),
    };
    writer.write_all(&protocol::encode_control(&proof)).await?;
    let HostMessage::Welcome {} = read_control(&mut reader, "welcome").await? else {
        return Err(HandshakeError::Unexpected {
            expected: "welcome",
        });
    };
    reader.set_limit(MAX_LINE_BYTES);
    Ok(Established { reader, writer })
}

/// The host's side: check the hello, challenge with a proof of its own, check
/// the init's proof, welcome. Returns the init's reported state too.
pub async fn host_side(
    stream: UnixStream,
    key: &UnitKey,
    unit: &str,
) -> Result<(Established, InitState), HandshakeError> {
    let (read, mut writer) = stream.into_split();
    let mut reader = LineReader::new(read, MAX_HANDSHAKE_LINE_BYTES);
    let InitMessage::Hello {
        version,
        unit: claimed,
        nonce,
    } = read_control(&mut reader, "hello").await?
    else {
        return Err(HandshakeError::Unexpected { expected: "hello" });
    };
    if version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version { got: version });
    }
    if claimed != unit {
        return Err(HandshakeError::WrongUnit { claimed });
    }
    let init_nonce = Nonce::from_hex(&nonce).ok_or(HandshakeError::BadNonce)?;
    let host_nonce = Nonce::generate();
    let challenge = HostMessage::Challenge {
        nonce: host_nonce.to_hex(),
        proof: key.prove(Role::Host, &init_nonce, unit),
    };
    writer
        .write_all(&protocol::encode_control(&challenge))
        .await?;
    let InitMessage::Proof { mac, state } = read_control(&mut reader, "proof").await? else {
        return Err(HandshakeError::Unexpected { expected: "proof" });
    };
    if !key.verify(Role::Init, &host_nonce, unit, &mac) {
        return Err(HandshakeError::BadProof(Role::Init));
    }
    writer
        .write_all(&protocol::encode_control(&HostMessage::Welcome {}))
        .await?;
    reader.set_limit(MAX_LINE_BYTES);
    Ok((Established { reader, writer }, state))
}

/// The next line, which must be a control message of type `T`.
async fn read_control<T: for<'de> serde::Deserialize<'de>>(
    reader: &mut LineReader<OwnedReadHalf>,
    expected: &'static str,
) -> Result<T, HandshakeError> {
    match reader.next_line().await? {
        LineEvent::Line => {
            let message = protocol::parse_control(reader.line())
                .map_err(|_| HandshakeError::Unexpected { expected })?;
            reader.consume();
            Ok(message)
        }
        LineEvent::TooLong { .. } => Err(HandshakeError::Unexpected { expected }),
        LineEvent::End { .. } => Err(HandshakeError::Closed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ExitReport;
    use tokio::io::AsyncBufReadExt;

    fn state() -> InitState {
        InitState {
            epoch: 2,
            lease_remaining_ms: 1234,
            executor_pid: 42,
            executor_exit: Some(ExitReport::Code(0)),
            pid1: false,
        }
    }

    #[tokio::test]
    async fn both_sides_agree_under_one_key_and_keep_what_follows() {
        let (init_end, host_end) = UnixStream::pair().unwrap();
        let key = UnitKey::generate();
        let init_key = key.clone();
        let init = tokio::spawn(async move {
            let mut established = init_side(init_end, &init_key, "unit-1", state)
                .await
                .unwrap();
            assert_eq!(
                established.reader.next_line().await.unwrap(),
                LineEvent::Line
            );
            established.reader.line().to_vec()
        });
        let (mut established, reported) = host_side(host_end, &key, "unit-1").await.unwrap();
        assert_eq!(reported, state());
        established
            .writer
            .write_all(b"{\"after\":1}\n")
            .await
            .unwrap();
        assert_eq!(init.await.unwrap(), b"{\"after\":1}\n");
    }

    #[tokio::test]
    async fn a_host_without_the_key_is_refused_by_the_init() {
        let (init_end, host_end) = UnixStream::pair().unwrap();
        let init = tokio::spawn(async move {
            init_side(init_end, &UnitKey::generate(), "unit-1", state).await
        });
        let host = host_side(host_end, &UnitKey::generate(), "unit-1").await;
        let init = init.await.unwrap();
        assert!(
            matches!(init, Err(HandshakeError::BadProof(Role::Host))),
            "{init:?}"
        );
        // The init hangs up before proving anything.
        assert!(matches!(host, Err(HandshakeError::Closed)), "{host:?}");
    }

    #[tokio::test]
    async fn an_init_for_another_unit_is_refused_before_any_proof() {
        let (init_end, host_end) = UnixStream::pair().unwrap();
        let key = UnitKey::generate();
        let init_key = key.clone();
        let init =
            tokio::spawn(async move { init_side(init_end, &init_key, "unit-2", state).await });
        let host = host_side(host_end, &key, "unit-1").await;
        assert!(
            matches!(&host, Err(HandshakeError::WrongUnit { claimed }) if claimed == "unit-2"),
            "{host:?}"
        );
        assert!(matches!(init.await.unwrap(), Err(HandshakeError::Closed)));
    }

    #[tokio::test]
    async fn a_replayed_or_reflected_proof_is_refused() {
        // An impostor in the unit can ask the host for its proof over a nonce
        // of its choosing; that proof must not pass as the init's.
        let (impostor, host_end) = UnixStream::pair().unwrap();
        let key = UnitKey::generate();
        let host = tokio::spawn(async move { host_side(host_end, &key, "unit-1").await });
        let (read, mut write) = impostor.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let nonce = Nonce::generate();
        let hello = InitMessage::Hello {
            version: PROTOCOL_VERSION,
            unit: "unit-1".into(),
            nonce: nonce.to_hex(),
        };
        write
            .write_all(&protocol::encode_control(&hello))
            .await
            .unwrap();
        let challenge = lines.next_line().await.unwrap().unwrap();
        let HostMessage::Challenge { proof, .. } =
            protocol::parse_control(challenge.as_bytes()).unwrap()
        else {
            panic!("{challenge}")
        };
        let reflected = InitMessage::Proof {
            mac: proof,
            state: state(),
        };
        write
            .write_all(&protocol::encode_control(&reflected))
            .await
            .unwrap();
        let host = host.await.unwrap();
        assert!(
            matches!(host, Err(HandshakeError::BadProof(Role::Init))),
            "{host:?}"
        );
    }

    #[tokio::test]
    async fn garbage_instead_of_hello_is_refused() {
        let (mut impostor, host_end) = UnixStream::pair().unwrap();
        impostor
            .write_all(b"{\"jsonrpc\":\"2.0\"}\n")
            .await
            .unwrap();
        let host = host_side(host_end, &UnitKey::generate(), "unit-1").await;
        assert!(
            matches!(host, Err(HandshakeError::Unexpected { expected: "hello" })),
            "{host:?}"
        );
        let (mut impostor, host_end) = UnixStream::pair().unwrap();
        impostor
            .write_all(&[b'!'; MAX_HANDSHAKE_LINE_BYTES * 2])
            .await
            .unwrap();
        drop(impostor);
        let host = host_side(host_end, &UnitKey::generate(), "unit-1").await;
        assert!(host.is_err(), "{host:?}");
    }
}

//! Stamps: HMAC-SHA256 under a key made for this process, so a stamp from
//! another process (another executor, a restarted one, or the model) never
//! verifies.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The per-process stamp key: 32 random bytes that never leave the executor.
#[derive(Clone)]
pub(crate) struct StampKey([u8; 32]);

impl StampKey {
    /// A fresh random key.
    pub fn random() -> Self {
        Self(rand::random())
    }

    /// The stamp of `message`: lower-case hex HMAC-SHA256.
    pub fn sign(&self, message: &[u8]) -> String {
        hex::encode(self.mac(message).finalize().into_bytes())
    }

    /// Whether `stamp` is this key's stamp of `message` (constant-time).
    pub fn verify(&self, message: &[u8], stamp: &str) -> bool {
        let Ok(bytes) = hex::decode(stamp) else {
            return false;
        };
        self.mac(message).verify_slice(&bytes).is_ok()
    }

    fn mac(&self, message: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(message);
        mac
    }
}

impl std::fmt::Debug for StampKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StampKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_verifies_only_under_its_own_key() {
        let key = StampKey::random();
        let stamp = key.sign(b"facts\0read");
        assert!(key.verify(b"facts\0read", &stamp));
        assert!(!key.verify(b"facts\0write", &stamp));
        assert!(!StampKey::random().verify(b"facts\0read", &stamp));
        assert!(!key.verify(b"facts\0read", "not hex"));
    }
}

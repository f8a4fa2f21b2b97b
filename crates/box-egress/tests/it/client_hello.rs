//! TLS ClientHello bytes built by hand, for the parser's unit tests and the proxy's
//! integration tests (the crate includes this file in its unit tests by path).

#![allow(dead_code)]

/// A ClientHello to build.
pub struct ClientHello {
    server_name: Option<String>,
    extra_server_name: Option<String>,
    padding: usize,
    cut: usize,
}

impl ClientHello {
    /// A TLS 1.3-shaped ClientHello naming `server_name` (or no server).
    pub fn new(server_name: Option<&str>) -> Self {
        Self {
            server_name: server_name.map(str::to_owned),
            extra_server_name: None,
            padding: 0,
            cut: 0,
        }
    }

    /// Add a padding extension of `bytes` bytes (a stand-in for a large key share).
    pub fn padding(mut self, bytes: usize) -> Self {
        self.padding = bytes;
        self
    }

    /// Add a second server_name extension.
    pub fn extra_server_name(mut self, name: &str) -> Self {
        self.extra_server_name = Some(name.to_owned());
        self
    }

    /// Drop the last `bytes` bytes of the body, keeping the lengths around it honest.
    pub fn cut(mut self, bytes: usize) -> Self {
        self.cut = bytes;
        self
    }

    /// The handshake message (type, length, body).
    pub fn handshake(&self) -> Vec<u8> {
        let mut extensions = Vec::new();
        for name in [&self.server_name, &self.extra_server_name]
            .into_iter()
            .flatten()
        {
            let mut entry = vec![0u8];
            push_vector16(&mut entry, name.as_bytes());
            let mut list = Vec::new();
            push_vector16(&mut list, &entry);
            push_extension(&mut extensions, 0, &list);
        }
        // supported_versions: TLS 1.3.
        push_extension(&mut extensions, 43, &[2, 3, 4]);
        if self.padding > 0 {
            push_extension(&mut extensions, 21, &vec![0; self.padding]);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        push_vector16(&mut body, &[0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[1, 0]);
        push_vector16(&mut body, &extensions);
        body.truncate(body.len() - self.cut);
        let length = body.len();
        let mut handshake = vec![1, (length >> 16) as u8, (length >> 8) as u8, length as u8];
        handshake.extend_from_slice(&body);
        handshake
    }

    /// The hello in one record (or as few 16 KiB records as it needs).
    pub fn bytes(&self) -> Vec<u8> {
        records(&self.handshake(), 1 << 14)
    }

    /// The hello cut into records of at most `fragment` bytes each.
    pub fn records(&self, fragment: usize) -> Vec<u8> {
        records(&self.handshake(), fragment)
    }
}

/// `handshake` cut into TLS handshake records of at most `fragment` bytes each.
pub fn records(handshake: &[u8], fragment: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in handshake.chunks(fragment) {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        out.extend_from_slice(chunk);
    }
    out
}

fn push_vector16(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn push_extension(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    push_vector16(out, data);
}

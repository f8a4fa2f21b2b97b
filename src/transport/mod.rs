//! Transports: stdio and streamable HTTP. The only module that knows HTTP.

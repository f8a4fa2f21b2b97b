//! The proxy: raw JSON-RPC routing between a session and its units, with id
//! remapping, cancellation, progress tokens and process-id namespacing.

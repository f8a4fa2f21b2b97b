//! The `[limits]` table (and a server's `limits`), `[lifecycle]`'s lease
//! and `[pool]`'s size: sizes, cores, counts and durations.

use std::time::Duration;

use super::super::fields::{LIMIT_FIELDS, LIMITS, Limit, LimitKind, LimitValue, Scope};
use super::super::kinds::Reads;
use super::super::model::{LimitsPolicy, defaults};
use super::super::tree::{Node, Value};
use super::super::value::{ByteSize, CpuQuota, parse_count, parse_duration};
use super::{Walk, join};

impl Walk {
    /// `[limits]` (`scope` session: every limit) or a server's `limits`
    /// (`scope` unit: its own), read over `base`, one row of `LIMIT_FIELDS` each.
    pub(super) fn limits(
        &mut self,
        node: Option<&Node>,
        field: &str,
        scope: Scope,
        base: &LimitsPolicy,
    ) -> Option<LimitsPolicy> {
        let Some(node) = node else {
            return Some(base.clone());
        };
        let accepted = match scope {
            Scope::Session => LIMITS.names(),
            Scope::Unit => Limit::unit_names(),
        };
        let fields = self.table(node, field, &accepted);
        let mut limits = base.clone();
        let mut ok = true;
        for limit in LIMIT_FIELDS {
            let Some(node) = fields.get(limit.field.name) else {
                continue;
            };
            let path = join(field, limit.field.name);
            let value = match limit.kind {
                LimitKind::Size => self.size(node, &path).map(LimitValue::Size),
                LimitKind::Cpus => self.cpus(node, &path).map(LimitValue::Cpus),
                LimitKind::Count => self.count(node, &path).map(LimitValue::Count),
                LimitKind::Duration => self.duration(node, &path).map(LimitValue::Duration),
            };
            match value {
                Some(value) => (limit.set)(&mut limits, value),
                None => ok = false,
            }
        }
        ok.then_some(limits)
    }

    pub(in crate::profile) fn size(&mut self, node: &Node, field: &str) -> Option<ByteSize> {
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, "a size like \"2GiB\"");
            return None;
        };
        ByteSize::parse(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    pub(in crate::profile) fn cpus(&mut self, node: &Node, field: &str) -> Option<CpuQuota> {
        let cores = match &node.value {
            Value::Float(number) => *number,
            Value::Integer(text) => text.parse::<f64>().unwrap_or(f64::NAN),
            _ => {
                self.wrong_type(node, field, "a number of cores like 2 or 0.5");
                return None;
            }
        };
        CpuQuota::from_cores(cores)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    pub(in crate::profile) fn count(&mut self, node: &Node, field: &str) -> Option<u64> {
        let Value::Integer(text) = &node.value else {
            self.wrong_type(node, field, "a whole number like 512");
            return None;
        };
        parse_count(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }

    pub(in crate::profile) fn duration(&mut self, node: &Node, field: &str) -> Option<Duration> {
        let Value::String(text) = &node.value else {
            self.wrong_type(node, field, "a duration like \"10m\"");
            return None;
        };
        parse_duration(text)
            .map_err(|message| self.problem(node, field, message))
            .ok()
    }
}

/// The most units a profile's `[pool]` keeps ready: each is a running unit
/// (a container, or a sandboxed process tree) that counts against the host.
const MAX_POOL: u64 = 256;

/// `lifecycle.lease`: a duration within the bounds.
pub(in crate::profile) struct Lease;

impl Reads<Duration> for Lease {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<Duration> {
        let lease = walk.duration(node, field)?;
        if (defaults::MIN_LEASE..=defaults::MAX_LEASE).contains(&lease) {
            return Some(lease);
        }
        walk.problem(
            node,
            field,
            format!(
                "\"{}\" is out of bounds; a lease is from {} to {} (a unit ends that long after its host stops renewing it)",
                humantime::format_duration(lease),
                humantime::format_duration(defaults::MIN_LEASE),
                humantime::format_duration(defaults::MAX_LEASE)
            ),
        );
        None
    }
}

/// `pool.size`: from 0 (no pool: a profile that extends one may say so) to [`MAX_POOL`].
pub(in crate::profile) struct PoolSize;

impl Reads<usize> for PoolSize {
    fn read(walk: &mut Walk, node: &Node, field: &str) -> Option<usize> {
        let size = match &node.value {
            Value::Integer(text) if text.trim() == "0" => 0,
            _ => walk.count(node, field)?,
        };
        if size <= MAX_POOL {
            return Some(usize::try_from(size).unwrap_or(0));
        }
        walk.problem(
            node,
            field,
            format!("{size} is out of bounds; a pool keeps from 0 to {MAX_POOL} units ready"),
        );
        None
    }
}

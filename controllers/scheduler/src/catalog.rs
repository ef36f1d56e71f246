//! Node catalog: nodes with identical scheduling-relevant attributes form one *class*, so a
//! job's hard constraints are evaluated once per class instead of once per node. The catalog
//! is rebuilt only when the node inventory changes; the per-cycle free index is built from it.

use std::collections::HashMap;

use crate::model::{NodeId, NodeState, NodeView, PendingJob, VClusterId};

/// The attributes filters look at. Two nodes with equal keys are interchangeable for every
/// filter, so feasibility is a property of the class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClassKey {
    pub schedulable: bool,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub features: Vec<String>,
    pub memory_gb: u32,
    pub cxl_memory_gb: u32,
    pub unified_memory: bool,
    pub home: Option<VClusterId>,
    pub private: bool,
    pub sensitive_pool: bool,
    gpu_link_bits: u64,
    memory_locality_bits: u64,
    nic_affinity_bits: u64,
}

#[derive(Debug, Clone)]
pub struct NodeClass {
    pub key: ClassKey,
    pub gpu_link_fitness: f64,
    pub memory_locality: f64,
    pub nic_affinity: f64,
    /// Node indices sorted by (group, fingerprint, id).
    pub members: Vec<u32>,
    /// Member count per (group, fingerprint), sorted by key.
    pub inventory: Vec<crate::select::BucketCount>,
}

/// Why a class is not feasible for a job (first failing filter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterOutcome {
    Feasible { borrowed: bool },
    NotSchedulable,
    SensitiveIsolation,
    GpuType,
    GpuCount,
    Features,
    Memory,
    UnifiedMemory,
    Ownership,
}

#[derive(Debug, Clone)]
pub struct NodeCatalog {
    nodes: Vec<NodeView>,
    classes: Vec<NodeClass>,
    class_of: Vec<u32>,
    index_of: NodeIndex,
    groups: u32,
}

/// Node id → index in the catalog: a table when the ids are dense (as the live adapter and
/// the simulator number them), else a map. The scheduler looks up every running node each
/// cycle.
#[derive(Debug, Clone)]
enum NodeIndex {
    Dense(Vec<u32>),
    Sparse(HashMap<NodeId, u32>),
}

impl NodeIndex {
    fn new(map: HashMap<NodeId, u32>) -> Self {
        let max = map.keys().map(|id| id.0 as usize).max().unwrap_or(0);
        if max < 2 * map.len() + 64 {
            let mut table = vec![u32::MAX; max + 1];
            for (id, i) in map {
                table[id.0 as usize] = i;
            }
            NodeIndex::Dense(table)
        } else {
            NodeIndex::Sparse(map)
        }
    }

    fn get(&self, id: NodeId) -> Option<u32> {
        match self {
            NodeIndex::Dense(t) => t.get(id.0 as usize).copied().filter(|&i| i != u32::MAX),
            NodeIndex::Sparse(m) => m.get(&id).copied(),
        }
    }
}

impl NodeCatalog {
    pub fn new(nodes: Vec<NodeView>) -> Self {
        let mut by_key: HashMap<ClassKey, u32> = HashMap::new();
        let mut classes: Vec<NodeClass> = Vec::new();
        let mut class_of = Vec::with_capacity(nodes.len());
        let mut index_of: HashMap<NodeId, u32> = HashMap::with_capacity(nodes.len());
        let mut groups = std::collections::BTreeSet::new();
        for (i, n) in nodes.iter().enumerate() {
            let mut features = n.features.clone();
            features.sort();
            features.dedup();
            let key = ClassKey {
                schedulable: n.state == NodeState::Ready,
                gpus: n.gpus,
                gpu_type: n.gpu_type.clone(),
                features,
                memory_gb: n.memory_gb,
                cxl_memory_gb: n.cxl_memory_gb,
                unified_memory: n.unified_memory,
                home: n.owner.home,
                private: n.owner.private,
                sensitive_pool: n.sensitive_pool,
                gpu_link_bits: n.gpu_link_fitness.to_bits(),
                memory_locality_bits: n.memory_locality.to_bits(),
                nic_affinity_bits: n.nic_affinity.to_bits(),
            };
            let next = classes.len() as u32;
            let c = *by_key.entry(key.clone()).or_insert(next);
            if c == next {
                classes.push(NodeClass {
                    key,
                    gpu_link_fitness: n.gpu_link_fitness,
                    memory_locality: n.memory_locality,
                    nic_affinity: n.nic_affinity,
                    members: Vec::new(),
                    inventory: Vec::new(),
                });
            }
            classes[c as usize].members.push(i as u32);
            class_of.push(c);
            index_of.insert(n.id, i as u32);
            groups.insert(n.topology_group);
        }
        for c in &mut classes {
            c.members.sort_by_key(|&i| {
                let n = &nodes[i as usize];
                (n.topology_group, n.conformance_fingerprint, n.id)
            });
            for &i in &c.members {
                let n = &nodes[i as usize];
                let key = (n.topology_group, n.conformance_fingerprint);
                match c.inventory.last_mut() {
                    Some((k, cnt)) if *k == key => *cnt += 1,
                    _ => c.inventory.push((key, 1)),
                }
            }
        }
        NodeCatalog {
            nodes,
            classes,
            class_of,
            index_of: NodeIndex::new(index_of),
            groups: groups.len() as u32,
        }
    }

    pub fn nodes(&self) -> &[NodeView] {
        &self.nodes
    }
    pub fn node(&self, idx: u32) -> &NodeView {
        &self.nodes[idx as usize]
    }
    pub fn classes(&self) -> &[NodeClass] {
        &self.classes
    }
    pub fn class_of(&self, idx: u32) -> u32 {
        self.class_of[idx as usize]
    }
    pub fn index_of(&self, id: NodeId) -> Option<u32> {
        self.index_of.get(id)
    }
    /// Number of distinct dragonfly groups in the inventory.
    pub fn group_count(&self) -> u32 {
        self.groups
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The filters of [`crate::filter::FILTERS`] in order (state → sensitive isolation →
    /// GPU type/count → features → memory (CXL only on opt-in) → unified memory), then
    /// ownership/borrowing.
    pub fn filter(&self, class: u32, job: &PendingJob) -> FilterOutcome {
        let k = &self.classes[class as usize].key;
        let c = &job.constraints;
        if let Err(why) = crate::filter::run(job, k) {
            return why;
        }
        match k.home {
            None => FilterOutcome::Feasible { borrowed: false },
            Some(h) if h == job.vcluster => FilterOutcome::Feasible { borrowed: false },
            // Borrowed nodes may be reclaimed, so non-preemptible work stays off them.
            Some(_) if c.allow_borrowed && !job.non_preemptible() && !k.private => {
                FilterOutcome::Feasible { borrowed: true }
            }
            Some(_) => FilterOutcome::Ownership,
        }
    }
}

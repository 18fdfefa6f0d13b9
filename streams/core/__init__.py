"""memstream's pure memory core ("functional core, thin shell").

No Kafka, no Faust, no I/O, no wall clock: the Faust agents decode a record, call one of
the entry points below with the user's :class:`UserMemory`, then write/send what the
returned :class:`Outcome` lists.

Entry points::

    process_candidate(memory, candidate, policy=None, promotion=None, decider=None) -> Outcome
    process_event(memory, event, policy=None, promotion=None) -> Outcome
    sweep_memory(memory, now_ms, policy=None) -> Outcome       # housekeeping timer (HousekeepingPolicy)
    UserMemory.from_nodes(motebit_id, node_records, aux_record) # rebuild after restart
"""

from .consolidation import (
    ConsolidationPolicy,
    Decider,
    Decision,
    DeterministicDecider,
    apply,
    check_decision,
    hard_rules,
)
from .exposure import GateResult, exposure_gate, quarantine_entry
from .hints import HeaderHints, hints_record, is_instruction_entry, read_header_hints
from .housekeeping import HousekeepingPolicy, sweep_memory
from .ids import NAMESPACE, derive_id, event_id_for, node_id_for, quarantine_id_for
from .ingest import (
    REDACTED_CONTENT,
    DedupWindow,
    Rejection,
    event_sort_key,
    validate_candidate,
    validate_event,
)
from .nodes import NODE_FIELDS, as_of, content_fingerprint, decayed_confidence, valid_at
from .process import Outcome, process_candidate, process_event
from .promotion import PromotionPolicy, should_promote
from .similarity import IndexConfig, SimilarityIndex, cosine, jaccard, normalize_text, text_similarity
from .state import UserMemory
from .vocabulary import (
    SENSITIVITY_LEVELS,
    VocabularyError,
    normalize_action,
    normalize_source,
    sensitivity_rank,
)

__all__ = [
    "ConsolidationPolicy", "Decider", "Decision", "DeterministicDecider", "apply", "check_decision", "hard_rules",
    "GateResult", "exposure_gate", "quarantine_entry",
    "HeaderHints", "hints_record", "is_instruction_entry", "read_header_hints",
    "HousekeepingPolicy", "sweep_memory",
    "NAMESPACE", "derive_id", "event_id_for", "node_id_for", "quarantine_id_for",
    "REDACTED_CONTENT", "DedupWindow", "Rejection", "event_sort_key",
    "validate_candidate", "validate_event",
    "NODE_FIELDS", "as_of", "content_fingerprint", "decayed_confidence", "valid_at",
    "Outcome", "process_candidate", "process_event",
    "PromotionPolicy", "should_promote",
    "IndexConfig", "SimilarityIndex", "cosine", "jaccard", "normalize_text", "text_similarity",
    "UserMemory",
    "SENSITIVITY_LEVELS", "VocabularyError", "normalize_action", "normalize_source", "sensitivity_rank",
]

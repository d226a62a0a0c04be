"""Strategy scopes (replicate, split) and pipeline schedules."""
from epl.strategies.base import (REPLICATE, SPLIT, Replicate, Split, Strategy,  # noqa: F401
                                 StrategyError, replicate, set_default_strategy, split)

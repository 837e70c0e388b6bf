"""The DPO dataset: rlcli's preference-pair JSONL as the cookbook's DPO recipe reads it.

The cookbook renders labelled comparisons into (chosen, rejected) datum pairs itself
(`DPODatasetBuilderFromComparisons`); what it leaves to a recipe is where the comparisons come from. This builder
reads them from a file that `rlcli.train.dpo` checked, each pair kept as its JSON text in the table (an Arrow table
gives every message every key, which the renderers refuse: rlcli.train.sl_data says the same) and turned into
cookbook messages per row. Imported lazily: it pulls in the cookbook and `datasets`.
"""

from __future__ import annotations

import json
from typing import Any

import chz
import datasets
from tinker_cookbook.preference.dpo_datasets import DPODatasetBuilderFromComparisons
from tinker_cookbook.preference.preference_datasets import ComparisonDatasetBuilder
from tinker_cookbook.preference.types import Comparison, LabeledComparison
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

from rlcli.train.renderers import cookbook_messages


@chz.chz
class PairsFile(ComparisonDatasetBuilder):
    """Comparisons from a JSONL of {"messages", "chosen", "rejected"}: chosen is always completion A."""

    file_path: str

    def get_train_and_test_datasets(self) -> tuple[datasets.Dataset, None]:
        with open(self.file_path, encoding="utf-8") as f:
            rows = [{"pair_json": line.strip()} for line in f if line.strip()]
        return datasets.Dataset.from_list(rows), None

    def example_to_labeled_comparison(self, example: dict[str, Any]) -> LabeledComparison:
        pair = json.loads(example["pair_json"])
        prompt = cookbook_messages(pair["messages"])
        chosen, rejected = (cookbook_messages([pair[k]]) for k in ("chosen", "rejected"))
        return LabeledComparison(comparison=Comparison(prompt, chosen, rejected), label="A")


def pairs_builder(common: ChatDatasetBuilderCommonConfig, file_path: str) -> DPODatasetBuilderFromComparisons:
    return DPODatasetBuilderFromComparisons(common_config=common, comparison_builder=PairsFile(file_path=file_path))

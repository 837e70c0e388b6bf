"""The SFT dataset: a JSONL of chat records as the cookbook's supervised recipe reads it.

The cookbook's own `FromConversationFileBuilder` puts the messages in an Arrow table, which gives every
message every key (None where absent), and hands OpenAI-shaped tool calls to the renderer as plain dicts:
a conversation with tool calls then cannot be rendered. This builder keeps each conversation as its JSON
text in the table and turns it into cookbook messages per row (`renderers.cookbook_messages`); rows are
shuffled and split exactly as the cookbook's builder does (same seed, same order), so runs and resumes
see the same batches. Imported lazily: it pulls in the cookbook and `datasets`.
"""

from __future__ import annotations

import json
from typing import Any

import chz
import datasets
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised.data import (
    FromConversationFileBuilder,
    SupervisedDatasetFromHFDataset,
    conversation_to_datum,
)

from rlcli.train.renderers import cookbook_messages


@chz.chz
class ConversationFileBuilder(FromConversationFileBuilder):
    def __call__(self) -> tuple[SupervisedDatasetFromHFDataset, SupervisedDatasetFromHFDataset | None]:
        with open(self.file_path, encoding="utf-8") as f:
            rows = [{"messages_json": json.dumps(json.loads(line)["messages"], ensure_ascii=False)}
                    for line in f if line.strip()]
        table = datasets.Dataset.from_list(rows).shuffle(seed=self.shuffle_seed)
        test = None
        if 0 < self.test_size < len(table):
            test, table = table.take(self.test_size), table.skip(self.test_size)
        renderer, config = self.renderer, self.common_config
        train_on = TrainOnWhat(config.train_on_what or TrainOnWhat.ALL_ASSISTANT_MESSAGES)

        def to_datum(row: dict[str, Any]) -> Any:
            messages = cookbook_messages(json.loads(row["messages_json"]))
            return conversation_to_datum(messages, renderer, config.max_length, train_on)

        train_set = SupervisedDatasetFromHFDataset(table, batch_size=config.batch_size, map_fn=to_datum)
        if test is None:
            return train_set, None
        return train_set, SupervisedDatasetFromHFDataset(test, batch_size=len(test), map_fn=to_datum)

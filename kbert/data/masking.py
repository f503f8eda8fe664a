"""Dynamic masked-LM masking: the masked positions of a batch, drawn in TensorFlow ops.

The third stage of the pretraining builders: a batched `Dataset.map` chooses the masked
positions of every row (single pieces, or whole words) and applies BERT's 80 % `[MASK]` /
10 % random token / 10 % unchanged replacement, with stateless random ops keyed by
`(seed, pass, batch index)`, so each pass draws new masks and a seed reproduces them.
"""

from kbert.backend import tensorflow
from kbert.data.checks import check_rate

tf = tensorflow.tensorflow("kbert's pretraining pipeline")


def check_masking_rates(mask_rate, random_token_rate, unchanged_rate):
    """Checks the 80/10/10 rates: each in [0, 1], random + unchanged at most 1."""
    for name, value in (
        ("mask_rate", mask_rate),
        ("random_token_rate", random_token_rate),
        ("unchanged_rate", unchanged_rate),
    ):
        check_rate(name, value)
    if random_token_rate + unchanged_rate > 1.0:
        raise ValueError(
            "`random_token_rate + unchanged_rate` must be at most 1 (the rest is the [MASK] "
            f"rate). Received: random_token_rate={random_token_rate}, "
            f"unchanged_rate={unchanged_rate}"
        )


class DynamicMasker:
    """Chooses and replaces the masked-LM positions of a packed batch, in TensorFlow ops."""

    def __init__(
        self,
        tokenizer,
        max_predictions,
        mask_rate,
        whole_word_masking,
        random_token_rate,
        unchanged_rate,
        nsp,
    ):
        self.max_predictions = max_predictions
        self.mask_rate = mask_rate
        self.whole_word_masking = whole_word_masking
        self.mask_token_rate = 1.0 - random_token_rate - unchanged_rate
        self.random_token_rate = random_token_rate
        self.nsp = nsp
        self.cls_id = int(tokenizer.cls_token_id)
        self.sep_id = int(tokenizer.sep_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self.mask_id = int(tokenizer.mask_token_id)
        vocabulary = list(tokenizer.vocabulary)
        unk_id = int(tokenizer.unk_token_id)
        specials = {self.cls_id, self.sep_id, self.pad_id, self.mask_id, unk_id}
        # Random replacements are uniform over the vocabulary minus the five special tokens.
        self.random_ids = tf.constant(
            [i for i in range(len(vocabulary)) if i not in specials], tf.int32
        )
        self.is_continuation = tf.constant([t.startswith("##") for t in vocabulary], tf.bool)

    def _choose_tokens(self, candidate, num_to_predict, seed):
        # Every candidate token is its own unit: take the `num_to_predict` best random scores.
        length = tf.shape(candidate)[1]
        scores = tf.random.stateless_uniform(tf.shape(candidate), seed)  # (batch, seq)
        scores = tf.where(candidate, scores, -1.0)
        best = tf.math.top_k(scores, k=self.max_predictions).indices  # (batch, preds)
        keep = tf.range(self.max_predictions)[None, :] < num_to_predict[:, None]
        return tf.where(keep, best, length)  # (batch, preds) positions, `length` = unused

    def _choose_whole_words(self, token_ids, candidate, num_to_predict, seed):
        batch = tf.shape(token_ids)[0]
        length = tf.shape(token_ids)[1]
        previous_candidate = tf.pad(candidate[:, :-1], [[0, 0], [1, 0]])
        continuation = tf.gather(self.is_continuation, token_ids) & previous_candidate
        word_start = candidate & ~continuation
        word_index = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1  # (batch, seq)
        num_words = tf.reduce_sum(tf.cast(word_start, tf.int32), axis=1)  # (batch,)
        # Pieces per word; non-candidate positions go to one extra, discarded segment.
        rows = tf.range(batch)[:, None] * length
        segment = tf.where(candidate, rows + word_index, batch * length)
        word_length = tf.math.unsorted_segment_sum(
            tf.ones_like(token_ids), segment, batch * length + 1
        )[:-1]
        word_length = tf.reshape(word_length, [batch, length])  # (batch, words)
        # Visit the words in a random order; take a word when it still fits in the budget,
        # skip it otherwise (as the reference's whole-word loop does). Each loop step jumps
        # straight to the next word that fits, so the loop runs at most `max_predictions`
        # times (every taken word uses at least one prediction).
        scores = tf.random.stateless_uniform([batch, length], seed)
        scores = tf.where(tf.range(length)[None, :] < num_words[:, None], scores, -1.0)
        order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
        ordered_length = tf.gather(word_length, order, batch_dims=1)  # (batch, words)
        visit_index = tf.range(length)[None, :]

        def take_next_word(step, remaining, last_visited, taken_in_order):
            fits = (
                (ordered_length > 0)
                & (ordered_length <= remaining[:, None])
                & (visit_index > last_visited[:, None])
            )  # (batch, words)
            found = tf.reduce_any(fits, axis=1)
            first = tf.argmax(tf.cast(fits, tf.int32), axis=1, output_type=tf.int32)
            size = tf.where(found, tf.gather(ordered_length, first, batch_dims=1), 0)
            pick = tf.one_hot(first, length, on_value=True, off_value=False) & found[:, None]
            last_visited = tf.where(found, first, length)
            return step + 1, remaining - size, last_visited, taken_in_order | pick

        def still_searching(step, remaining, last_visited, taken_in_order):
            return tf.reduce_any(last_visited < length)

        _, _, _, taken_in_order = tf.while_loop(
            still_searching,
            take_next_word,
            (
                tf.constant(0),
                num_to_predict,
                tf.fill([batch], -1),
                tf.zeros([batch, length], tf.bool),
            ),
            maximum_iterations=self.max_predictions,
        )
        taken = tf.gather(taken_in_order, tf.argsort(order, axis=1, stable=True), batch_dims=1)
        in_chosen_word = tf.gather(taken, tf.maximum(word_index, 0), batch_dims=1)
        return candidate & in_chosen_word

    def __call__(self, token_ids, segment_ids, lengths, nsp_labels, seed):
        seq_length = tf.shape(token_ids)[1]
        positions_range = tf.range(seq_length)[None, :]
        padding_mask = positions_range < lengths[:, None]  # (batch, seq)
        candidate = (
            padding_mask
            & tf.not_equal(token_ids, self.cls_id)
            & tf.not_equal(token_ids, self.sep_id)
            & tf.not_equal(token_ids, self.pad_id)
        )
        num_candidates = tf.reduce_sum(tf.cast(candidate, tf.int32), axis=1)
        # float64 and round-half-to-even, as Python's round() in the reference.
        num_to_predict = tf.cast(
            tf.round(tf.cast(num_candidates, tf.float64) * self.mask_rate), tf.int32
        )
        num_to_predict = tf.minimum(self.max_predictions, tf.maximum(1, num_to_predict))
        num_to_predict = tf.minimum(num_to_predict, num_candidates)
        choose_seed, action_seed, token_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, num=3)
        )
        if self.whole_word_masking:
            chosen = self._choose_whole_words(token_ids, candidate, num_to_predict, choose_seed)
            key = tf.where(chosen, positions_range, seq_length)  # (batch, seq)
        else:
            key = self._choose_tokens(candidate, num_to_predict, choose_seed)  # (batch, preds)
        # Chosen positions in ascending order, padded with `seq_length`, then with 0.
        positions = -tf.math.top_k(-key, k=self.max_predictions).values  # (batch, preds)
        valid = positions < seq_length
        positions = tf.where(valid, positions, 0)
        labels = tf.gather(token_ids, positions, batch_dims=1)
        labels = tf.where(valid, labels, 0)

        shape = tf.shape(positions)
        action = tf.random.stateless_uniform(shape, action_seed)
        random_ids = tf.gather(
            self.random_ids,
            tf.random.stateless_uniform(
                shape, token_seed, minval=0, maxval=tf.size(self.random_ids), dtype=tf.int32
            ),
        )
        replacement = tf.where(
            action < self.mask_token_rate,
            self.mask_id,
            tf.where(action < self.mask_token_rate + self.random_token_rate, random_ids, labels),
        )
        # Padded slots point at [CLS] (position 0) and write it back unchanged.
        replacement = tf.where(valid, replacement, token_ids[:, :1])
        batch_index = tf.broadcast_to(tf.range(shape[0])[:, None], shape)
        masked_ids = tf.tensor_scatter_nd_update(
            token_ids, tf.stack([batch_index, positions], axis=-1), replacement
        )

        x = {
            "token_ids": masked_ids,
            "segment_ids": segment_ids,
            "padding_mask": tf.cast(padding_mask, tf.int32),
            "mask_positions": positions,
        }
        y = {"mlm": labels}
        sample_weight = {"mlm": tf.cast(valid, tf.float32)}
        if self.nsp:
            y["nsp"] = nsp_labels
            sample_weight["nsp"] = tf.ones_like(nsp_labels, tf.float32)
        return x, y, sample_weight

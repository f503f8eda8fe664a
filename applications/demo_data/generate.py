"""Writes the demo's small corpora: `corpus.txt` (pretraining) and `reviews.tsv` (sentiment).

The text is written by this project from templates, so it can be shipped and regenerated
byte-for-byte: `python applications/demo_data/generate.py`. Documents in `corpus.txt` are
separated by blank lines, one sentence per line (the original BERT input format).
"""

import random
from pathlib import Path

HERE = Path(__file__).resolve().parent

SUBJECTS = {
    "film": [
        "the film",
        "the movie",
        "the story",
        "the plot",
        "the acting",
        "the soundtrack",
        "the ending",
    ],
    "food": [
        "the soup",
        "the bread",
        "the pasta",
        "the dessert",
        "the coffee",
        "the service",
        "the menu",
    ],
    "gadget": [
        "the phone",
        "the battery",
        "the screen",
        "the camera",
        "the keyboard",
        "the charger",
    ],
    "trip": [
        "the hotel",
        "the beach",
        "the museum",
        "the train",
        "the guide",
        "the room",
        "the view",
    ],
}
POSITIVE = [
    "wonderful",
    "excellent",
    "delightful",
    "great",
    "superb",
    "charming",
    "brilliant",
    "pleasant",
    "lovely",
]
NEGATIVE = [
    "terrible",
    "awful",
    "dreadful",
    "boring",
    "poor",
    "disappointing",
    "bland",
    "broken",
    "dull",
]
INTENSIFIERS = ["", "really ", "truly ", "rather ", "quite ", "very "]
FACTS = {
    "film": [
        "{s} was shown in a small cinema near the river .",
        "many people came to see {s} on the first night .",
        "the director talked about {s} after the screening .",
        "critics wrote long reviews of {s} in the weekend papers .",
    ],
    "food": [
        "{s} was served in a warm bowl at the corner table .",
        "the cook prepared {s} early in the morning .",
        "guests ordered {s} with a glass of water .",
        "the waiter described {s} before taking the order .",
    ],
    "gadget": [
        "{s} arrived in a plain box with a short manual .",
        "the shop replaced {s} after a week of use .",
        "engineers tested {s} for several days .",
        "she charged {s} every night before bed .",
    ],
    "trip": [
        "{s} was a short walk from the old station .",
        "we visited {s} on the second day of the trip .",
        "the guide told us the history of {s} .",
        "tourists took photographs of {s} at sunset .",
    ],
}


def opinion(rng, topic, positive):
    subject = rng.choice(SUBJECTS[topic])
    adjective = rng.choice(POSITIVE if positive else NEGATIVE)
    negated = rng.random() < 0.25
    if negated:  # "not terrible" is mildly positive, "not great" negative.
        adjective = rng.choice(NEGATIVE if positive else POSITIVE)
        return f"{subject} was not {adjective} at all ."
    return f"{subject} was {rng.choice(INTENSIFIERS)}{adjective} ."


def write_corpus(rng, num_documents=400):
    lines = []
    for _ in range(num_documents):
        topic = rng.choice(sorted(SUBJECTS))
        for _ in range(rng.randint(4, 9)):
            if rng.random() < 0.5:
                lines.append(rng.choice(FACTS[topic]).format(s=rng.choice(SUBJECTS[topic])))
            else:
                lines.append(opinion(rng, topic, rng.random() < 0.5))
        lines.append("")
    (HERE / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")


def write_reviews(rng, num_reviews=1600):
    rows = ["sentence\tlabel"]
    for _ in range(num_reviews):
        topic = rng.choice(sorted(SUBJECTS))
        positive = rng.random() < 0.5
        sentences = [opinion(rng, topic, positive)]
        if rng.random() < 0.5:
            sentences.insert(0, rng.choice(FACTS[topic]).format(s=rng.choice(SUBJECTS[topic])))
        rows.append(f"{' '.join(sentences)}\t{int(positive)}")
    (HERE / "reviews.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_corpus(random.Random(0))
    write_reviews(random.Random(1))

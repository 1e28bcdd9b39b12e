"""Built-in corpus: deterministic TinyStories-style children's stories with PLANTED structure.

The generator is the default corpus of the toolkit (no download needed). Every story is seeded
from (seed, story index) alone, so any shard of stories can be regenerated on its own and the
same seed always gives the same bytes. Three kinds of structure are planted, and their ground
truth is exposed as data (`PLANTED`, `promised_rates`) so tests and analyses can score recovery:

- bigram: colour adjectives are always followed by a toy or vehicle; "the" is always followed by
  a noun; "felt"/"very" are always followed by an emotion; "then"/"and"/"so" by a pronoun;
- interchangeable: the emotions (happy, glad, excited, ...) all follow "felt"/"very", the
  pronouns he/she/they all follow "then"/"and"/"so" (so SigmaB = Bbar^T Bbar groups them);
- topical: each story has one animal whose habitat and actions (fish: pond, water, swim, ...)
  are spread over the whole story, not only next to the animal (recovered by Phibar).

`FUNCTION_WORDS` lists the template words shared by stories of every topic (plus punctuation).
Phibar rows are scored over the other ("content") columns: a raw prefix average also holds
"the", "." and "was", which outrank topic words once |V| is large (here the -1/|V| centring of
Phibar happens to push them down, but a score should not depend on that). Every group is
recovered with precision@10 >= 0.8 from 3,000 stories of 201 tokens (tests/test_corpus.py).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pythia_probe.errors import BadInputError

COLOURS = ("red", "blue", "green", "yellow", "pink", "purple", "orange", "white", "black",
           "brown")
TOYS = ("ball", "doll", "kite", "balloon", "robot", "drum", "puzzle", "blocks", "teddy", "yoyo")
VEHICLES = ("car", "truck", "bus", "bike", "boat", "plane", "train", "rocket", "tractor",
            "scooter")
EMOTIONS = ("happy", "glad", "excited", "joyful", "cheerful", "proud", "sad", "scared", "upset",
            "angry", "worried", "nervous", "surprised", "calm", "brave", "shy")
PRONOUNS = ("he", "she", "they")
PRONOUN_LEADS = ("then", "and", "so")
EMOTION_LEADS = ("felt", "very")
GIRLS = ("Lily", "Mia", "Anna", "Lucy", "Sue", "Emma", "Zoe", "Amy", "Rose", "Kim", "Ella",
         "Grace", "Ruby", "Sara", "Jane", "Kate", "Molly", "Daisy", "Ivy", "Nora", "Hannah",
         "Chloe", "Sophie", "Alice", "Clara", "Eva", "Maya", "Lena", "Julia", "Tina", "Polly",
         "Jenny", "Wendy", "Holly", "Fiona", "Greta", "Hazel", "Iris", "Olive", "Pam", "Nina",
         "Tess", "Vera", "Dora", "Gwen", "Jill", "Lola", "Mabel", "Nell", "Ada")
BOYS = ("Tom", "Ben", "Sam", "Max", "Tim", "Jack", "Leo", "Bob", "Dan", "Joe", "Alex", "Finn",
        "Jake", "Luke", "Noah", "Owen", "Ryan", "Adam", "Eli", "Gus", "Hugo", "Ian", "Jon",
        "Kyle", "Liam", "Mark", "Ned", "Oscar", "Paul", "Rex", "Seth", "Ted", "Vic", "Will",
        "Zack", "Carl", "Dave", "Eric", "Fred", "Hank", "Roy", "Ray", "Lou", "Ken", "Gil", "Abe",
        "Cole", "Dean", "Glen", "Kurt")
FOODS = ("apple", "cake", "cookie", "bread", "soup", "pie", "candy", "grapes", "pear", "plum",
         "cherry", "peach", "carrot", "pizza", "sandwich", "cheese", "muffin", "jam", "juice",
         "rice", "beans", "peas", "lemon", "melon", "nuts", "popcorn", "toast", "yogurt",
         "noodles", "pancake", "waffle", "cupcake", "pudding", "salad", "biscuit")
CLOTHES = ("hat", "dress", "coat", "scarf", "shoes", "socks", "boots", "shirt", "mittens",
           "cap", "jacket", "sweater", "gloves", "belt", "skirt", "pants", "bow", "ribbon",
           "necklace", "crown", "apron", "cape", "vest", "slippers", "pajamas")
SPOTS = ("park", "school", "shop", "garden", "library", "kitchen", "street", "town", "city",
         "market", "playground", "bakery", "castle", "room", "attic", "porch", "station",
         "bridge", "museum", "tent", "church", "square", "corner", "store", "hall")
GAMES = ("run", "jump", "dance", "draw", "read", "paint", "skip", "laugh", "clap", "build",
         "bake", "hum", "nap", "race", "spin", "twirl", "whistle", "count", "rest", "giggle",
         "cook", "knit", "sew", "write", "explore")
TASTES = ("yummy", "tasty", "sweet", "warm", "fresh", "crunchy", "juicy", "soft", "sticky",
          "spicy", "salty", "sour", "creamy", "gooey", "chewy", "crispy", "fluffy", "golden",
          "tiny", "huge")
WEATHER = ("sunny", "rainy", "windy", "cloudy", "snowy", "foggy", "stormy", "bright",
           "chilly", "hot", "cold", "misty")
RELATIVES = ("grandma", "grandpa", "aunt", "uncle", "cousin", "sister", "brother", "baby",
             "teacher", "neighbor", "doctor", "baker", "king", "queen", "nurse", "farmer",
             "mailman", "princess", "prince", "wizard")
ADVERBS = ("quickly", "slowly", "happily", "quietly", "loudly", "softly", "gently",
           "carefully", "bravely", "proudly", "sadly", "kindly", "politely", "eagerly",
           "calmly", "boldly", "sweetly", "merrily", "nicely", "lazily")


@dataclass(frozen=True)
class Topic:
    """One habitat: its animals and the places, things and actions that go with them."""

    animals: tuple[str, ...]
    places: tuple[str, ...]
    things: tuple[str, ...]
    actions: tuple[str, ...]

    @property
    def context(self) -> tuple[str, ...]:
        return self.places + self.things + self.actions

    @property
    def words(self) -> tuple[str, ...]:
        return self.animals + self.context


TOPICS: dict[str, Topic] = {
    "pond": Topic(("fish", "frog", "duck", "turtle"), ("pond", "lake", "river", "shore"),
                  ("water", "bubbles", "waves", "reeds"), ("swim", "splash", "dive")),
    "tree": Topic(("bird", "owl", "parrot", "robin"), ("tree", "nest", "sky", "branch"),
                  ("feathers", "wings", "eggs", "clouds"), ("fly", "sing", "chirp")),
    "farm": Topic(("cow", "pig", "horse", "sheep", "hen"), ("farm", "barn", "field", "fence"),
                  ("hay", "mud", "corn", "milk"), ("graze", "oink", "trot")),
    "forest": Topic(("bear", "fox", "rabbit", "deer", "squirrel"), ("forest", "woods", "den",
                    "cave"), ("berries", "acorns", "logs", "honey"), ("hop", "dig", "hide")),
    "house": Topic(("cat", "dog", "puppy", "kitten"), ("house", "yard", "bed", "rug"),
                   ("bone", "leash", "blanket", "toys"), ("bark", "purr", "fetch")),
    "jungle": Topic(("monkey", "lion", "tiger", "elephant", "zebra"), ("jungle", "vines",
                    "hill", "grass"), ("bananas", "mangoes", "coconuts", "rocks"),
                    ("climb", "roar", "swing")),
}


@dataclass(frozen=True)
class PlantedGroup:
    """Ground truth for one planted relation.

    kind: "bigram" (`words` are followed by a member of `partners` at `rate`),
    "interchangeable" (`words` all follow the words in `partners`, and only those), or
    "topical" (`words` are a topic's animals; `partners` the topic's context words, which
    co-occur with them anywhere in the same story).
    """

    kind: str
    words: tuple[str, ...]
    partners: tuple[str, ...]
    rate: float | None = None



def topic_of(word: str) -> str | None:
    """Name of the topic a (lower-case) word belongs to, or None."""
    for name, t in TOPICS.items():
        if word in t.words:
            return name
    return None


# ---------------------------------------------------------------- templates
# Rules the templates keep (they make the bigram rates exact): "the" only before a noun; a colour
# only before a toy or vehicle; "felt"/"very" only before an emotion; an emotion only after them;
# "then"/"and"/"so" only at a sentence start, before a pronoun; a pronoun only after them.
OPENINGS = (
    "Once upon a time, there was a little {A} who lived in a big {place}.",
    "{N} was a little {kind} who loved to play outside.",
    "One day, {N} went to the {place} to see the {A}.",
)
TOPICAL = (
    "The {A} liked to {action} in the {place}.",
    "{N} saw the {A} near the {thing} by the {place}.",
    "Every day, the {A} would {action} by the {place}.",
    "There were lots of {thing} in the {place}.",
    "{N} played with the {A} in the {place}.",
    "The {A} wanted to {action} with {N}.",
    "{N} looked at the {thing} in the {place} for a long time.",
    "The {A} liked the {thing} near the {place}.",
    "It was fun to {action} near the {place}.",
    "So {P} smiled at the {A}.",
    "{N} found a {colour} {toy} in the {place}.",
    "And {P} said, \"I want to {action} too!\"",
)
GENERIC = (
    "{N} had a {colour} {toy}.",
    "{N} played with {poss} {colour} {toy}.",
    "A {colour} {vehicle} went by.",
    "{N} wanted to ride in a {colour} {vehicle}.",
    "Then {P} felt {emotion}.",
    "{N} was very {emotion}.",
    "And {P} said, \"I like the {toy}!\"",
    "Mom said, \"You look very {emotion} today.\"",
    "Then they played all day.",
    "Dad gave {N} a {colour} {vehicle}.",
    "{N} felt {emotion} when {poss} friend came to play.",
    "So they went to the {spot} together.",
    "And they ate the {food}.",
    "{N} ate a {taste} {food} at the {spot}.",
    "It was a {weather} day.",
    "{N} visited {poss} {relative} at the {spot}.",
    "{N} ran {adverb} to the {spot}.",
    "The {relative} smiled {adverb}.",
    "Mom made {food} for lunch.",
    "{N} put on {poss} {clothing}.",
    "{N} wore a {clothing} to the {spot}.",
    "At the {spot}, {N} liked to {game}.",
    "{N} wanted to {game} with {poss} friend.",
)
ENDINGS = (
    "At the end of the day, {N} went home.",
    "{N} said goodbye to the {A}.",
    "So {P} went home to tell mom about the {A}.",
)
ALL_TEMPLATES = OPENINGS + TOPICAL + GENERIC + ENDINGS
_FIELD = re.compile(r"\{(\w+)\}")
_WORD = re.compile(r"[A-Za-z]+|\S")
_A_AN = re.compile(r"\b([Aa]) ([aeiou])")
_FIELDS = {t: tuple(sorted(set(_FIELD.findall(t)))) for t in ALL_TEMPLATES}
_NEEDS_AN = {t: bool(re.search(r"\b[Aa] \{", t)) for t in ALL_TEMPLATES}
# every field value is one word, so a sentence's token count is fixed by its template
_NTOK = {t: len(_WORD.findall(_FIELD.sub("x", t))) for t in ALL_TEMPLATES}

FUNCTION_WORDS: frozenset[str] = frozenset(
    w.lower() for t in ALL_TEMPLATES for w in _WORD.findall(_FIELD.sub(" ", t))
) | {"girl", "boy", "his", "her", "an"} | set(PRONOUNS)
"""Template words shared by stories of every topic, plus punctuation (lower-case)."""


_POOLS = {"colour": COLOURS, "toy": TOYS, "vehicle": VEHICLES, "emotion": EMOTIONS,
          "food": FOODS, "clothing": CLOTHES, "spot": SPOTS, "game": GAMES, "taste": TASTES,
          "weather": WEATHER, "relative": RELATIVES, "adverb": ADVERBS}
_TOPIC_POOLS = {k: sum((getattr(t, k + "s") for t in TOPICS.values()), ())
                for k in ("place", "thing", "action")} | {"A": sum((t.animals for t in
                                                                     TOPICS.values()), ())}


def _after_the() -> tuple[str, ...]:
    """Every word the templates can put right after "the" (the nouns)."""
    words = set()
    for t in ALL_TEMPLATES:
        for slot in re.findall(r"\b[Tt]he \{(\w+)\}", t):
            words.update(_POOLS.get(slot) or _TOPIC_POOLS[slot])
        words.update(re.findall(r"\b[Tt]he ([a-z]+)", t))
    return tuple(sorted(words))


NOUNS = _after_the()


def _planted() -> dict[str, PlantedGroup]:
    groups = {
        "colour->toy/vehicle": PlantedGroup("bigram", COLOURS, TOYS + VEHICLES, 1.0),
        "the->noun": PlantedGroup("bigram", ("the",), NOUNS, 1.0),
        "felt/very->emotion": PlantedGroup("bigram", EMOTION_LEADS, EMOTIONS, 1.0),
        "then/and/so->pronoun": PlantedGroup("bigram", PRONOUN_LEADS, PRONOUNS, 1.0),
        "emotion": PlantedGroup("interchangeable", EMOTIONS, EMOTION_LEADS),
        "pronoun": PlantedGroup("interchangeable", PRONOUNS, PRONOUN_LEADS),
    }
    for name, t in TOPICS.items():
        groups[f"topic:{name}"] = PlantedGroup("topical", t.animals, t.context)
    return groups


PLANTED: dict[str, PlantedGroup] = _planted()


def promised_rates(p_topic: float = 0.9) -> dict[str, float]:
    """Rates the generator guarantees in expectation (tests measure them on generated text).

    "<bigram group>": P(next word in partners | word in group), for each bigram PlantedGroup.
    "topic": fraction of topic-context words (places, things, actions) in a story that belong
    to the topic of the story's animal: p_topic (the rest come from the other topics).
    """
    rates = {name: g.rate for name, g in PLANTED.items() if g.kind == "bigram"}
    rates["topic"] = p_topic
    return rates


class _Story:
    """Per-story random state: hero, animal, topic; fills template fields."""

    def __init__(self, rng: random.Random, p_topic: float) -> None:
        self.rng, self.p_topic = rng, p_topic
        girl = rng.random() < 0.5
        self.name = rng.choice(GIRLS if girl else BOYS)
        self.kind, self.pron, self.poss = ("girl", "she", "her") if girl else ("boy", "he", "his")
        self.topic = rng.choice(tuple(TOPICS))
        self.animal = rng.choice(TOPICS[self.topic].animals)
        self.fixed = {"N": self.name, "P": self.pron, "A": self.animal, "kind": self.kind,
                      "poss": self.poss}

    def _topical(self, attr: str) -> str:
        name = self.topic
        if self.rng.random() >= self.p_topic:
            name = self.rng.choice([t for t in TOPICS if t != self.topic])
        return self.rng.choice(getattr(TOPICS[name], attr))

    def field(self, key: str) -> str:
        if key in self.fixed:
            return self.fixed[key]
        if key in ("place", "thing", "action"):
            return self._topical(key + "s")
        return self.rng.choice(_POOLS[key])

    def sentence(self, template: str) -> str:
        text = template.format(**{k: self.field(k) for k in _FIELDS[template]})
        return _A_AN.sub(r"\1n \2", text) if _NEEDS_AN[template] else text


def count_tokens(text: str) -> int:
    """Word-level token count of ASCII generator text (same rule as pythia_probe.tokenizer)."""
    return len(_WORD.findall(text))


def story(index: int, seed: int = 0, *, length: int = 24, min_tokens: int = 0,
          p_topic: float = 0.9) -> str:
    """Story number `index` of the stream for `seed` (depends on (seed, index) only).

    length: mean number of body sentences (uniform in [length/2, 3 length/2]); body sentences
    are added beyond that until the story has at least `min_tokens` word-level tokens.
    """
    rng = random.Random(f"pythia_probe.builtin/{seed}/{index}")
    s = _Story(rng, p_topic)
    openings = OPENINGS[: rng.choice((1, 2, 3))]
    parts = [s.sentence(t) for t in openings]
    n_body = rng.randint(max(1, length // 2), max(1, (3 * length) // 2))
    ntok = sum(_NTOK[t] for t in openings)
    i = 0
    while i < n_body or ntok < min_tokens:
        template = rng.choice(TOPICAL if rng.random() < 0.6 else GENERIC)
        parts.append(s.sentence(template))
        ntok += _NTOK[template]
        i += 1
        if i % 5 == 0:
            parts[-1] += "\n"
    parts.append(s.sentence(rng.choice(ENDINGS)))
    return " ".join(parts).replace("\n ", "\n")


def _check_args(n_stories: int, seed: int, length: int, min_tokens: int, p_topic: float) -> None:
    if not isinstance(n_stories, int) or n_stories < 0:
        raise BadInputError(f"n_stories must be an integer >= 0, got {n_stories!r}")
    if not isinstance(seed, int) or seed < 0:
        raise BadInputError(f"seed must be an integer >= 0, got {seed!r}")
    if length < 1 or min_tokens < 0:
        raise BadInputError(f"need length >= 1 and min_tokens >= 0, got {length}, {min_tokens}")
    if not 0.0 <= p_topic <= 1.0:
        raise BadInputError(f"p_topic must be in [0, 1], got {p_topic}")


def generate_stories(n_stories: int, seed: int = 0, *, start: int = 0, length: int = 24,
                     min_tokens: int = 0, p_topic: float = 0.9) -> list[str]:
    """Stories start .. start+n_stories-1 of the deterministic stream for `seed`.

    Same arguments -> same strings, byte for byte; generate_stories(10) equals
    generate_stories(4) + generate_stories(6, start=4). See `story` for length/min_tokens.
    """
    _check_args(n_stories, seed, length, min_tokens, p_topic)
    return [story(i, seed, length=length, min_tokens=min_tokens, p_topic=p_topic)
            for i in range(start, start + n_stories)]


def precision_at_k(row: Sequence[float], vocab: Sequence[str], relevant: Iterable[str],
                   k: int = 10, exclude: Iterable[str] = ()) -> float:
    """Fraction of the top-k entries of `row` (over words not in `exclude`) that are relevant.

    k is capped at the number of relevant words still eligible, so a group of 3 is scored
    over its top 2 when the row's own word is excluded.
    """
    relevant, exclude = set(relevant), set(exclude)
    eligible = [i for i, w in enumerate(vocab) if w not in exclude]
    k = min(k, len(relevant - exclude))
    if k == 0:
        raise BadInputError("no relevant words left after exclusion")
    top = sorted(eligible, key=lambda i: -row[i])[:k]
    return sum(vocab[i] in relevant for i in top) / k

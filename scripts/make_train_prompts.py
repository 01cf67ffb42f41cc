"""Write the drafter's code and math TRAINING prompts: templated tasks, made here, seeded.

Why: the drafter must be trained only on sources no shipped trace records from. The recorded
benchmarks (HumanEval, MBPP, GSM8K test, MT-Bench, Dolly passages) are evaluation sets; the
chat training set (chat-train.jsonl: IFEval, Vicuna, Self-Instruct, Dolly, GSM8K train) has
little code. The target writes the answers (self-distillation), so what the prompts must give
is the DOMAIN (Python functions, arithmetic word problems), not benchmark items. These are
templated from lists below with a seeded generator: same seed, same files, no third-party text.

    python scripts/make_train_prompts.py   # writes specsim/data/prompts/{code,math}-train.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "specsim" / "data" / "prompts"

CODE_TASKS = [
    "returns the sum of the even numbers in a list of integers",
    "reverses the words of a sentence but keeps the punctuation in place",
    "checks whether a string is a palindrome, ignoring case and spaces",
    "returns the n-th Fibonacci number using iteration",
    "merges two sorted lists into one sorted list",
    "counts how many times each character appears in a string and returns a dict",
    "finds the second largest number in a list, or None when there is none",
    "removes duplicate items from a list while keeping their first order",
    "returns the greatest common divisor of two positive integers",
    "converts a Roman numeral string to an integer",
    "converts an integer to its binary representation as a string",
    "flattens a nested list of arbitrary depth",
    "returns all prime numbers below n using a sieve",
    "checks whether two strings are anagrams of each other",
    "rotates a list to the right by k positions",
    "returns the longest common prefix of a list of strings",
    "computes the running average of a list of numbers",
    "groups a list of words by their first letter",
    "returns the indices of two numbers in a list that add up to a target",
    "checks whether the brackets in a string are balanced",
    "returns the transpose of a matrix given as a list of lists",
    "counts the vowels in a string",
    "splits a list into chunks of size k",
    "returns the factorial of n using recursion",
    "finds the maximum sum of a contiguous sub-list",
    "returns the median of a list of numbers",
    "capitalizes the first letter of every word in a string",
    "checks whether a year is a leap year",
    "returns the number of days between two dates given as YYYY-MM-DD strings",
    "parses a CSV line with quoted fields into a list of strings",
    "returns the k most frequent words in a text",
    "computes the dot product of two vectors",
    "checks whether a number is a perfect square without using sqrt",
    "returns the run-length encoding of a string",
    "decodes a run-length encoded string",
    "returns the intersection of two lists without duplicates",
    "sorts a list of tuples by their second element",
    "computes the Levenshtein distance between two strings",
    "returns True when a list is sorted in non-decreasing order",
    "converts a temperature from Celsius to Fahrenheit and rounds to one decimal",
    "returns the sum of the digits of an integer",
    "finds the first non-repeating character in a string",
    "returns the power set of a list",
    "checks whether a string is a valid IPv4 address",
    "returns the number of islands in a grid of 0s and 1s",
    "implements binary search on a sorted list and returns the index or -1",
    "counts the number of set bits in an integer",
    "returns a dictionary mapping each word to its length",
    "computes the area of a triangle from its three side lengths",
    "returns the list of all permutations of a string",
]
CODE_FRAMES = [
    "Write a Python function `{name}` that {task}.",
    "Write a Python function named {name} that {task}. Include a docstring.",
    "Implement `{name}(...)` in Python: it {task}. Add two example calls.",
    "Write Python code for a function {name} which {task}, then show one test with assert.",
    'Complete this Python function.\n\ndef {name}(*args):\n    """A function that {task}."""\n',
    "Write an efficient Python solution: a function `{name}` that {task}. Explain its time "
    "complexity in one sentence.",
]

MATH_FRAMES = [
    "{a} friends share {b} apples equally and each eats {c} of their share. How many apples are "
    "left in total?",
    "A shop sells pens at ${p} each. Mia buys {a} pens and pays with a ${d} note. How much change "
    "does she get?",
    "A train travels {a} km in {b} hours. At the same speed, how far does it travel in {c} hours?",
    "Tom has {a} marbles. He gives {b} to his sister and then buys {c} more. How many marbles "
    "does he have now?",
    "A garden is {a} m long and {b} m wide. A path of width 1 m runs around it inside the "
    "garden. What is the area of the garden without the path?",
    "A baker makes {a} loaves a day and sells each for ${p}. How much does she earn in {c} days?",
    "There are {a} students in a class. {b} of them walk to school and the rest take the bus. "
    "What percentage takes the bus? Round to the nearest whole number.",
    "A tank holds {d} liters. It is filled at {a} liters per minute and leaks {b} liters per "
    "minute. How many minutes until it is full, starting empty?",
    "Sam reads {a} pages on Monday, twice as many on Tuesday and {c} fewer than Tuesday on "
    "Wednesday. How many pages does he read in the three days?",
    "A car uses {b} liters of fuel per 100 km. Fuel costs ${p} per liter. How much does a trip "
    "of {d} km cost?",
    "The price of a jacket is ${d}. It is reduced by {a} percent and then by another {b} "
    "percent. What is the final price?",
    "A farmer has {a} chickens and {b} cows. How many legs do the animals have altogether?",
]
MATH_TAIL = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def _name(task: str, rnd: random.Random) -> str:
    words = [w for w in task.replace(",", "").split() if w.isalpha()][:3]
    return "_".join(words).lower() + ("" if rnd.random() < 0.7 else f"_{rnd.randint(2, 9)}")


def code_prompts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        task = rnd.choice(CODE_TASKS)
        text = rnd.choice(CODE_FRAMES).format(name=_name(task, rnd), task=task)
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def math_prompts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        frame = rnd.choice(MATH_FRAMES)
        vals = {
            "a": rnd.randint(3, 60),
            "b": rnd.randint(2, 40),
            "c": rnd.randint(2, 12),
            "d": rnd.choice([20, 50, 100, 200, 250, 400, 500, 1000]),
            "p": rnd.choice([1, 2, 3, 4, 5, 6, 8, 12, 15]),
        }
        text = frame.format(**vals) + MATH_TAIL
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


MATH_RANGES = {"a": 58, "b": 39, "c": 11, "d": 8, "p": 9}  # values math_prompts draws from
NAME_VARIANTS = 9  # _name: the bare name or one of 8 numbered ones


def capacity(frames: list[str], ranges: dict[str, int]) -> int:
    """How many distinct texts the frames can make (each field drawn from its range). The
    generators draw until they have n distinct ones, so n past this would loop forever."""
    total = 0
    for frame in frames:
        fields = {f for _, f, _, _ in string.Formatter().parse(frame) if f}
        total += math.prod(ranges[f] for f in fields)
    return total


CODE_MAX = capacity(CODE_FRAMES, {"name": NAME_VARIANTS, "task": 1}) * len(CODE_TASKS)
MATH_MAX = capacity(MATH_FRAMES, MATH_RANGES)


def write(path: Path, source: str, texts: list[str]) -> None:
    """Through a temporary name: an interrupted run leaves the previous file whole."""
    from specsim.outputs import write_text

    lines = [
        json.dumps({"id": f"{source}-{i}", "source": source, "turns": [t]}, ensure_ascii=False)
        for i, t in enumerate(texts)
    ]
    write_text("\n".join(lines) + "\n", path)


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script, whole

    ap = LineParser(prog="make_train_prompts.py", description=__doc__.split("\n\n")[0])
    most = "the templates make at most"
    ap.add_argument("--code", type=whole(1, CODE_MAX), default=400,
                    help=f"code prompts (400; {most} {CODE_MAX:,})")  # fmt: skip
    ap.add_argument("--math", type=whole(1, MATH_MAX), default=400,
                    help=f"math prompts (400; {most} {MATH_MAX:,})")  # fmt: skip
    ap.add_argument("--seed", type=whole(0, 2**31), default=0)
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    code = code_prompts(args.code, args.seed)
    maths = math_prompts(args.math, args.seed + 1)
    write(OUT / "code-train.jsonl", "code-train", code)
    write(OUT / "math-train.jsonl", "math-train", maths)
    print(f"wrote {OUT / 'code-train.jsonl'} and {OUT / 'math-train.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

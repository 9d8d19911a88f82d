"""Instructions made from templates, for a teacher to answer (distill.py): coding tasks and general questions.

Every (template, subject) pair is one instruction; a fixed fifth of the subjects is held out, so that the
held-out instructions ask about things no training instruction mentions.
"""
from __future__ import annotations

import random
import zlib

TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
         "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list",
         "finds the largest element of a list", "checks whether a string is a palindrome",
         "computes the factorial of a number", "flattens a nested list", "converts Celsius to Fahrenheit",
         "counts the words in a text", "returns the greatest common divisor of two numbers",
         "sorts a list of dictionaries by a key", "reads a CSV file into a list of rows",
         "validates an email address", "computes the average of a list of numbers",
         "finds the second largest number in a list", "transposes a matrix", "checks whether two strings are anagrams",
         "generates all permutations of a list", "implements binary search", "counts character frequencies",
         "capitalizes every word in a sentence", "converts a decimal number to binary", "rotates a list by k steps",
         "finds common elements of two lists", "checks whether a year is a leap year", "chunks a list into pieces",
         "computes the sum of digits of a number", "parses a date string", "finds the longest word in a sentence",
         "implements a stack class", "implements a queue with two stacks", "computes a running total",
         "removes punctuation from a string", "returns the median of a list", "groups words by their first letter",
         "checks balanced parentheses", "computes the power set of a set", "implements bubble sort",
         "implements quicksort", "converts a Roman numeral to an integer", "finds the missing number in a range",
         "writes a dictionary to a JSON file", "retries a function call on failure", "memoizes a function",
         "computes the dot product of two vectors", "counts lines in a file", "splits a camelCase name into words"]
HOWTOS = ["read a file line by line", "sort a dictionary by value", "make an HTTP request", "handle exceptions",
          "use list comprehensions", "format strings", "create a virtual environment", "write unit tests",
          "use a context manager", "parse command-line arguments", "work with dates and times", "use regular expressions",
          "define a class with properties", "iterate over two lists at once", "copy a list", "merge two dictionaries",
          "measure how long code takes", "use type hints", "write a generator", "log messages",
          "run code in parallel", "serialize objects to JSON", "use a set", "reverse a list", "walk a directory tree"]
CONCEPTS = ["recursion", "photosynthesis", "inflation", "gravity", "machine learning", "the water cycle", "DNA",
            "a black hole", "compound interest", "the internet", "electricity", "democracy", "an API", "encryption",
            "evolution", "climate change", "a database index", "vaccines", "supply and demand", "object-oriented programming",
            "the stock market", "a neural network", "plate tectonics", "the immune system", "version control",
            "renewable energy", "a hash table", "the scientific method", "blockchain", "probability", "opportunity cost",
            "big O notation", "the greenhouse effect", "caching", "a compiler", "relativity", "the French Revolution",
            "a recession", "sleep", "memory in computers"]
PAIRS = [("a list", "a tuple"), ("weather", "climate"), ("a virus", "a bacterium"), ("RAM", "storage"),
         ("a process", "a thread"), ("speed", "velocity"), ("TCP", "UDP"), ("a compiler", "an interpreter"),
         ("stocks", "bonds"), ("mitosis", "meiosis"), ("HTTP", "HTTPS"), ("a function", "a method"),
         ("an atom", "a molecule"), ("SQL", "NoSQL databases"), ("a lake", "a sea"), ("frontend", "backend"),
         ("saving", "investing"), ("a simile", "a metaphor"), ("deep copy", "shallow copy"), ("AI", "machine learning")]
ACTIVITIES = ["learning a new language", "staying focused while studying", "writing clean code", "saving money",
              "sleeping better", "giving a presentation", "starting to run", "cooking for beginners", "debugging a program",
              "working from home", "reading more books", "managing time", "preparing for a job interview",
              "learning to program", "taking care of houseplants", "traveling on a budget", "writing an essay",
              "reducing stress", "keeping a team motivated", "learning math"]
FORMS = ["poem", "story", "paragraph", "product description", "thank-you note", "haiku"]
TOPICS = ["the ocean", "a rainy day", "friendship", "a robot learning to paint", "autumn", "the moon", "a lost key",
          "a city at night", "coffee", "a first day at school", "mountains", "a computer that dreams"]
THINGS = ["programming languages", "healthy breakfasts", "countries in Europe", "uses of Python", "planets",
          "famous scientists", "ways to reuse plastic bottles", "sorting algorithms", "data structures", "board games"]

TEMPLATES = [("Write a Python function that {}.", TASKS), ("Show me Python code that {}.", TASKS),
             ("Implement a Python function which {}, with a docstring.", TASKS),
             ("Write a function that {} and explain how it works.", TASKS),
             ("How do I {} in Python?", HOWTOS), ("Show an example of how to {} in Python.", HOWTOS),
             ("Explain {} in simple terms.", CONCEPTS), ("What is {}?", CONCEPTS), ("Why does {} matter?", CONCEPTS),
             ("Explain {} to a ten-year-old.", CONCEPTS), ("Summarize what {} is in two sentences.", CONCEPTS),
             ("What is the difference between {} and {}?", PAIRS), ("Compare {} and {}.", PAIRS),
             ("Give me three tips for {}.", ACTIVITIES), ("What are common mistakes when {}?", ACTIVITIES),
             ("Write a short {} about {}.", [(f, t) for f in FORMS for t in TOPICS]), ("List five {}.", THINGS),
             ("Name a few {} and say one thing about each.", THINGS)]


def heldout_subject(subject) -> bool:
    return zlib.crc32(repr(subject).encode()) % 5 == 0


def instructions(count: int, split: str = "train", seed: int = 0) -> list[str]:
    """`count` distinct instructions of the split ("train" or "heldout"), in a shuffled order (fewer if the
    templates make fewer)."""
    pool = [template.format(*(s if isinstance(s, tuple) else (s,)))
            for template, subjects in TEMPLATES for s in subjects if heldout_subject(s) == (split == "heldout")]
    random.Random(seed).shuffle(pool)
    return pool[:count]

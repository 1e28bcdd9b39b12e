"""The one place for memory, disk and time planning (a new fit check belongs here):

- :mod:`.budget`: the memory a device offers (the one budget every check reads);
- :mod:`.rates`: the device's multiply-add rates, measured once, now;
- :mod:`.statistics`: the statistics engines' sizes, ``--engine auto`` and their fit checks;
- :mod:`.step`: one sweep step's memory and multiply-adds (each analysis declares its cost);
- :mod:`.disk`: the sweep's downloads and the disk they may hold;
- :mod:`.estimate`: how long a sweep takes, from the rates and the downloads;
- :mod:`.sweep`: ``plan(job) -> SweepPlan`` and ``SweepPlan.check(budget)``, the checked plan
  the sweep's runner executes as it is.

Pure arithmetic on shapes and the budget: it imports no analysis, statistics or sweep module
(they ask it), so every layer above can.
"""

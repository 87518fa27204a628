"""The pure utilities every layer may use: errors, formatting, atomic files, the output
registry, order statistics, intervals, schedules, datasheet peaks, the streaming reader of
Kineto's JSON. No torch; nothing above imports from here that imports back.
"""

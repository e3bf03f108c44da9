"""The racing game that atari.py plays with ``env_id=CarRacing-v3``: Gymnasium's CarRacing drawn faster.

    pip install -e '.[examples,box2d,video]'
    python -m tinyverse examples/atari.py run --set env_id=CarRacing-v3 --prefix racing   # 1 player + 1 trainer
    python -m tinyverse examples/atari.py eval -n 5 --prefix racing                       # 5 greedy races, mp4s

An environment, not an experiment: atari.py's learner (APPO with V-trace) plays it with the racing
game's defaults there (its 5 discrete actions, the road above the dashboard at 42x42 grayscale, 4
physics frames an agent step, rewards scaled by 0.1). ``FastCarRacing`` draws the same frames as the
stock env and repeats each action inside. Measured results: docs/examples.rst.
"""

import gymnasium as gym
import numpy as np

try:
    from gymnasium.envs.box2d import car_racing
    from pygame import gfxdraw
except (ImportError, gym.error.DependencyNotInstalled):
    raise ImportError("the racing game needs Box2D: pip install -e '.[examples,box2d]'", name="Box2D") from None


class FastCarRacing(car_racing.CarRacing):
    """Gymnasium's CarRacing with its road drawn from one NumPy transform a frame, and its action repeat inside.

    The stock env moves each of ~700 grass and road polygons to the screen in
    Python, every frame, to draw the few dozen in view: most of a frame's time.
    This draws the same polygons, in the same order, colours and draw calls,
    after the same clip test, so its frames are the stock env's (tested); the
    physics is untouched.

    ``frame_skip`` repeats each action that many physics frames and draws only
    the last one, the one the agent sees; rewards, ends and frames are the
    stock env's under a repeat wrapper (tested).
    """

    def __init__(self, frame_skip: int = 1, **kwargs):
        super().__init__(**kwargs)
        assert frame_skip >= 1, "frame_skip must be at least 1"
        self.frame_skip, self._drawing = frame_skip, True
        if frame_skip > 1:  # a video of one frame per agent step plays at real speed
            self.metadata = {**self.metadata, "render_fps": max(1, round(self.metadata["render_fps"] / frame_skip))}

    def step(self, action):
        if action is None:  # reset's first, actionless frame
            return super().step(action)
        total = 0.0
        for i in range(self.frame_skip):
            self._drawing = i == self.frame_skip - 1
            obs, reward, terminated, truncated, info = super().step(action)
            total += reward
            if terminated or truncated:
                break
        if not self._drawing:  # the episode ended before the repeat's last frame: draw the one it ended on
            self._drawing = True
            obs = self.state = self._render("state_pixels")
        return obs, total, terminated, truncated, info

    def _render(self, mode):
        if mode == "state_pixels" and not self._drawing:
            return self.state  # a frame inside an action repeat: nobody looks at it
        return super()._render(mode)

    def _render_road(self, zoom, translation, angle):
        if getattr(self, "_track", None) is not self.road_poly:  # a new track since the last frame: a reset
            d, grass = car_racing.GRASS_DIM, []
            for x in range(-20, 20, 2):
                for y in range(-20, 20, 2):
                    grass.append([(d * x + d, d * y), (d * x, d * y), (d * x, d * y + d), (d * x + d, d * y + d)])
            road = [[(p[0], p[1]) for p in poly] for poly, _ in self.road_poly]
            self._polys = np.array(grass + road, np.float64).reshape(-1, 4, 2)
            self._colors = [self.grass_color] * len(grass) + [[int(c) for c in color] for _, color in self.road_poly]
            self._track = self.road_poly
        b = car_racing.PLAYFIELD
        field = [(b, b), (b, -b), (-b, -b), (-b, b)]
        self._draw_colored_polygon(self.surf, field, self.bg_color, zoom, translation, angle, clip=False)
        cos, sin = np.cos(angle), np.sin(angle)
        x, y = self._polys[..., 0], self._polys[..., 1]
        px, py = (x * cos - y * sin) * zoom + translation[0], (x * sin + y * cos) * zoom + translation[1]
        m, w, h = car_racing.MAX_SHAPE_DIM, car_racing.WINDOW_W, car_racing.WINDOW_H
        seen = ((-m <= px) & (px <= w + m) & (-m <= py) & (py <= h + m)).any(1)
        for i in np.flatnonzero(seen):
            points = list(zip(px[i].tolist(), py[i].tolist(), strict=True))
            gfxdraw.aapolygon(self.surf, points, self._colors[i])
            gfxdraw.filled_polygon(self.surf, points, self._colors[i])

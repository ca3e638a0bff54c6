"""The function templates `actions-gen` draws instances from (see `fic.data.actions_gen`).

A template is one tool: its name, what it does (`action`, a verb phrase: "book a flight"),
and 2 to 5 parameters. Each parameter has a value pool, a `clause` that states it inside a
one-sentence request ("from {v}") and a few standalone sentences that state it in a shard
("I'm flying from {v}."). Values appear in the text exactly as a correct call writes them
(dates as YYYY-MM-DD, times as HH:MM), so a model that reads the conversation can copy them.

`SEEN` feed train, dev and test; `UNSEEN` are held out for `test-unseen`: no seen split
ever lists them, not even as a distractor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    name: str
    type: str                   # "string", "integer" or "float" (the schema's type)
    description: str
    values: tuple
    clause: str                 # inside the one-sentence request: "from {v}"
    says: tuple[str, ...]       # a shard of its own: "I'm flying from {v}."
    required: bool = True
    enum: bool = False          # the schema lists `values` as its enum

    def schema(self) -> dict:
        spec = {"type": self.type, "description": self.description}
        if self.enum:
            spec["enum"] = list(self.values)
        return spec


@dataclass(frozen=True)
class Template:
    name: str
    description: str
    action: str                 # "book a flight": intents and requests are built around it
    params: tuple[Param, ...]

    def schema(self) -> dict:
        return {"name": self.name, "description": self.description,
                "parameters": {"type": "dict", "properties": {p.name: p.schema() for p in self.params},
                               "required": [p.name for p in self.params if p.required]}}


def P(name: str, type: str, description: str, values: tuple, clause: str, *says: str, required: bool = True,
      enum: bool = False) -> Param:
    return Param(name, type, description, tuple(values), clause, says, required, enum)


CITIES = ("Paris", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Toronto", "Chicago", "Boston", "Seattle",
          "Denver", "Dublin", "Vienna", "Prague", "Oslo", "Sydney", "Cairo", "Lima", "Seoul", "Mumbai", "Nairobi",
          "Austin", "Miami", "Zurich", "Athens", "Warsaw", "Helsinki", "Osaka", "Dallas", "Phoenix")
PEOPLE = ("Alice", "Bruno", "Chen", "Diana", "Elena", "Farid", "Greta", "Hugo", "Irene", "Jonas", "Kiara", "Liam",
          "Maya", "Nora", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wanda", "Yara", "Zane")
DATES = tuple(f"2025-{month:02d}-{day:02d}" for month in range(1, 13) for day in range(1, 29))
TIMES = tuple(f"{hour:02d}:{minute:02d}" for hour in range(6, 23) for minute in (0, 15, 30, 45))
AMOUNTS = tuple(round(cents / 100, 2) for cents in range(525, 50000, 175))  # 5.25 ... 499.75
SMALL = tuple(range(2, 10))
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CAD", "CHF")
RESTAURANTS = ("Luigi's", "Blue Lotus", "The Green Fork", "Casa Miguel", "Sakura House", "Olive Tree",
               "Golden Dragon", "Le Petit Bistro", "Spice Route", "Harbor Grill")
DOCTORS = ("Dr. Patel", "Dr. Nguyen", "Dr. Okafor", "Dr. Schmidt", "Dr. Rossi", "Dr. Kim", "Dr. Haddad",
           "Dr. Larsen")
LENGTH_UNITS = ("meters", "feet", "miles", "kilometers", "inches", "yards")
LANGUAGES = ("English", "French", "German", "Spanish", "Italian", "Japanese", "Dutch")


def _codes(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{n}" for n in range(10_000, 100_000, 1_111))


SEEN = (
    Template("book_flight", "Book a one-way flight.", "book a flight", (
        P("origin", "string", "The departure city.", CITIES, "from {v}",
          "I'm flying from {v}.", "The departure city is {v}.", "I'll be leaving from {v}."),
        P("destination", "string", "The arrival city.", CITIES, "to {v}",
          "I want to fly to {v}.", "The destination is {v}.", "I'm going to {v}."),
        P("date", "string", "The departure date, as YYYY-MM-DD.", DATES, "on {v}",
          "I want to fly on {v}.", "The flight should be on {v}.", "The date is {v}."),
        P("cabin", "string", "The cabin class.", ("economy", "premium", "business"), "in {v} class",
          "Put me in {v} class.", "I'd like {v} class.", required=False, enum=True),
        P("passengers", "integer", "The number of passengers.", SMALL, "for {v} passengers",
          "We are {v} passengers.", "Book it for {v} people.", required=False))),
    Template("send_money", "Send money to a contact.", "send money", (
        P("recipient", "string", "The recipient of the money.", PEOPLE, "to {v}",
          "It's for {v}.", "The money goes to {v}.", "Send it to {v}."),
        P("amount", "float", "The amount.", AMOUNTS, "of {v}",
          "The amount is {v}.", "Send {v}.", "It should be {v}."),
        P("currency", "string", "The currency of the amount.", CURRENCIES, "in {v}",
          "Use {v} as the currency.", "The currency is {v}.", required=False, enum=True))),
    Template("set_alarm", "Set an alarm on the phone.", "set an alarm", (
        P("time", "string", "The alarm time, as HH:MM.", TIMES, "for {v}",
          "Set it for {v}.", "The alarm time is {v}.", "Wake me at {v}."),
        P("label", "string", "The alarm's label.", ("gym", "meds", "school run", "standup", "laundry",
                                                    "call mom", "yoga", "dentist", "bus", "piano practice"),
          "labelled \"{v}\"", "Label it \"{v}\".", "Call the alarm \"{v}\"."),
        P("repeat", "string", "The repeat schedule.", ("daily", "weekdays", "weekends"), "repeating {v}",
          "Make it repeat {v}.", "It should repeat {v}.", required=False, enum=True))),
    Template("create_reminder", "Create a reminder.", "create a reminder", (
        P("text", "string", "The reminder text.", ("renew passport", "water the plants", "pay rent",
                                                         "buy milk", "book a haircut", "return library books",
                                                         "call the bank", "pick up dry cleaning"),
          "to \"{v}\"", "The reminder should say \"{v}\".", "Remind me to \"{v}\"."),
        P("date", "string", "The reminder date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's for {v}.", "Set it for {v}.", "The date is {v}."),
        P("time", "string", "The reminder time, as HH:MM.", TIMES, "at {v}",
          "Make it at {v}.", "The time is {v}.", required=False))),
    Template("get_weather", "Get the weather forecast for a city and day.", "check the weather forecast", (
        P("city", "string", "The city.", CITIES, "for {v}",
          "It's for {v}.", "The city is {v}.", "I mean the weather in {v}."),
        P("date", "string", "The forecast date, as YYYY-MM-DD.", DATES, "on {v}",
          "I need it for {v}.", "The day is {v}."),
        P("units", "string", "The temperature units.", ("celsius", "fahrenheit"), "in {v}",
          "Give it in {v}.", "Use {v}.", required=False, enum=True))),
    Template("convert_length", "Convert a length from one unit to another.", "convert a length", (
        P("value", "float", "The length value.", AMOUNTS, "of {v}",
          "The value is {v}.", "The length is {v}."),
        P("from_unit", "string", "The unit to convert from.", LENGTH_UNITS, "from {v}",
          "It's measured in {v}.", "Convert from {v}.", enum=True),
        P("to_unit", "string", "The unit to convert to.", LENGTH_UNITS, "to {v}",
          "I want it in {v}.", "Convert it to {v}.", enum=True))),
    Template("convert_currency", "Convert an amount between currencies.", "convert an amount", (
        P("amount", "float", "The amount.", AMOUNTS, "of {v}",
          "The amount is {v}.", "It's {v}."),
        P("from_currency", "string", "The currency to convert from.", CURRENCIES, "from {v}",
          "It's in {v}.", "Convert from {v}.", enum=True),
        P("to_currency", "string", "The currency to convert to.", CURRENCIES, "to {v}",
          "I want it in {v}.", "Convert it to {v}.", enum=True))),
    Template("place_order", "Order a product from the store.", "place an order", (
        P("product", "string", "The product.", ("running shoes", "coffee beans", "desk lamp", "yoga mat",
                                                          "phone charger", "water bottle", "rain jacket",
                                                          "notebook", "headphones", "backpack"),
          "for {v}", "I want {v}.", "The product is {v}.", "It's the {v}."),
        P("quantity", "integer", "The quantity to order.", SMALL, "in a quantity of {v}",
          "I need {v} of them.", "The quantity is {v}."),
        P("color", "string", "The color of the product.", ("black", "white", "red", "blue", "green", "gray"),
          "in {v}", "Make it {v}.", "I'd like it in {v}.", required=False, enum=True))),
    Template("book_hotel", "Book a hotel room.", "book a hotel room", (
        P("city", "string", "The city of the hotel.", CITIES, "in {v}",
          "The hotel should be in {v}.", "It's in {v}.", "I'm staying in {v}."),
        P("check_in", "string", "The check-in date, as YYYY-MM-DD.", DATES, "from {v}",
          "I check in on {v}.", "Check-in is {v}."),
        P("nights", "integer", "The number of nights.", SMALL, "for {v} nights",
          "I'm staying {v} nights.", "It's for {v} nights."),
        P("guests", "integer", "The number of guests.", SMALL, "for {v} guests",
          "We are {v} guests.", "There will be {v} guests.", required=False),
        P("room_type", "string", "The room type.", ("single", "double", "suite"), "in a {v} room",
          "I'd like a {v} room.", "The room type is {v}.", required=False, enum=True))),
    Template("reserve_table", "Reserve a table at a restaurant.", "reserve a table", (
        P("restaurant", "string", "The restaurant's name.", RESTAURANTS, "at {v}",
          "It's at {v}.", "The restaurant is {v}."),
        P("date", "string", "The date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's for {v}.", "The date is {v}."),
        P("time", "string", "The time, as HH:MM.", TIMES, "at {v}",
          "We'd like to eat at {v}.", "The time is {v}."),
        P("party_size", "integer", "The number of people.", SMALL, "for {v} people",
          "We are {v} people.", "It's a party of {v}."))),
    Template("send_message", "Send a text message to a contact.", "send a message", (
        P("recipient", "string", "The contact to message.", PEOPLE, "to {v}",
          "It's for {v}.", "Send it to {v}.", "The message goes to {v}."),
        P("text", "string", "The message text.", ("running late", "see you soon", "call me back",
                                                   "dinner is ready", "happy birthday", "meeting moved",
                                                   "on my way", "thanks for today"),
          "saying \"{v}\"", "The message says \"{v}\".", "Write \"{v}\"."),
        P("channel", "string", "The messaging app.", ("sms", "whatsapp", "signal"), "by {v}",
          "Send it by {v}.", "Use {v}.", required=False, enum=True))),
    Template("schedule_meeting", "Put a meeting in the calendar.", "schedule a meeting", (
        P("title", "string", "The meeting title.", ("budget review", "team sync", "design kickoff",
                                                     "quarterly planning", "client call", "retrospective"),
          "called \"{v}\"", "Call it \"{v}\".", "The title is \"{v}\"."),
        P("date", "string", "The meeting date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's on {v}.", "The date is {v}."),
        P("time", "string", "The start time, as HH:MM.", TIMES, "at {v}",
          "It starts at {v}.", "Make it {v}."),
        P("duration_minutes", "integer", "The length in minutes.", (15, 20, 25, 40, 45, 50, 75, 90), "for {v} minutes",
          "It lasts {v} minutes.", "Make it {v} minutes long.", required=False))),
    Template("rent_car", "Rent a car.", "rent a car", (
        P("city", "string", "The pick-up city.", CITIES, "in {v}",
          "I'll pick it up in {v}.", "The pick-up city is {v}."),
        P("pickup_date", "string", "The pick-up date, as YYYY-MM-DD.", DATES, "from {v}",
          "I need it from {v}.", "Pick-up is on {v}."),
        P("days", "integer", "The number of rental days.", SMALL, "for {v} days",
          "I need it for {v} days.", "It's a {v}-day rental."),
        P("car_type", "string", "The car type.", ("compact", "suv", "van", "convertible"), "of type {v}",
          "I'd like a {v}.", "The car type is {v}.", required=False, enum=True))),
    Template("buy_tickets", "Buy tickets for an event.", "buy event tickets", (
        P("event", "string", "The event's name.", ("jazz night", "city marathon", "comedy show", "opera gala",
                                                    "film festival", "rock concert", "ballet evening"),
          "for the {v}", "It's for the {v}.", "The event is the {v}."),
        P("quantity", "integer", "The number of tickets.", SMALL, "in a quantity of {v}",
          "I need {v} tickets.", "Get {v} tickets."),
        P("date", "string", "The event date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's on {v}.", "The date is {v}.", required=False))),
    Template("order_food", "Order food for delivery.", "order food", (
        P("restaurant", "string", "The restaurant's name.", RESTAURANTS, "from {v}",
          "Order from {v}.", "The restaurant is {v}."),
        P("dish", "string", "The dish.", ("pad thai", "margherita pizza", "caesar salad", "ramen",
                                                    "veggie burger", "chicken curry", "sushi platter"),
          "for {v}", "I want the {v}.", "Get me the {v}."),
        P("quantity", "integer", "The number of portions.", SMALL, "in a quantity of {v}",
          "Make it {v} portions.", "I need {v} of them."),
        P("delivery_time", "string", "The delivery time, as HH:MM.", TIMES, "delivered at {v}",
          "Deliver it at {v}.", "Bring it at {v}.", required=False))),
    Template("set_thermostat", "Set the thermostat of a room.", "set the thermostat", (
        P("room", "string", "The room.", ("living room", "bedroom", "kitchen", "office",
                                                           "nursery", "basement"),
          "in the {v}", "It's the {v}.", "I mean the {v}."),
        P("temperature", "float", "The target temperature in degrees.", tuple(t / 2 for t in range(33, 57)),
          "to {v} degrees", "Set it to {v} degrees.", "I want {v} degrees."),
        P("mode", "string", "The thermostat mode.", ("heat", "cool", "auto"), "in {v} mode",
          "Use {v} mode.", "Put it in {v} mode.", required=False, enum=True))),
    Template("play_music", "Play a song on a speaker.", "play a song", (
        P("song", "string", "The song title.", ("Blue Skies", "Night Drive", "Paper Hearts", "Golden Hour",
                                                "River Road", "Neon Lights", "Summer Rain"),
          "called \"{v}\"", "The song is \"{v}\".", "Play \"{v}\"."),
        P("artist", "string", "The artist's name.", PEOPLE, "by {v}",
          "It's by {v}.", "The artist is {v}."),
        P("volume", "integer", "The volume, from 10 to 100.", (15, 25, 35, 45, 55, 65, 75, 85, 95), "at volume {v}",
          "Set the volume to {v}.", "Play it at volume {v}.", required=False))),
    Template("translate_text", "Translate a phrase into another language.", "translate a phrase", (
        P("text", "string", "The phrase.", ("where is the station", "good morning",
                                                          "how much is this", "I am lost", "thank you very much",
                                                          "the bill please", "nice to meet you", "see you tomorrow",
                                                          "is this seat free", "I need a doctor",
                                                          "what time is it", "the room is too cold"),
          "\"{v}\"", "The phrase is \"{v}\".", "Translate \"{v}\"."),
        P("target_language", "string", "The target language.", LANGUAGES,
          "into {v}", "Put it into {v}.", "I need it in {v}.", enum=True),
        P("source_language", "string", "The language of the phrase.", LANGUAGES, "from {v}",
          "The phrase is in {v}.", "It's written in {v}.", required=False, enum=True))),
    Template("calculate_tip", "Work out the tip for a restaurant bill.", "calculate a tip", (
        P("bill_amount", "float", "The bill amount before the tip.", AMOUNTS, "on a bill of {v}",
          "The bill is {v}.", "We paid {v}."),
        P("tip_percent", "integer", "The tip in percent.", (10, 12, 15, 18, 20, 22, 25), "at {v} percent",
          "Tip {v} percent.", "The tip is {v} percent."),
        P("people", "integer", "The number of people splitting the bill.", SMALL, "split {v} ways",
          "Split it between {v} people.", "There are {v} of us.", required=False))),
    Template("track_package", "Track a parcel.", "track a package", (
        P("tracking_number", "string", "The tracking number.", _codes("ZX"), "with number {v}",
          "The tracking number is {v}.", "It's parcel {v}."),
        P("carrier", "string", "The carrier.", ("UPS", "FedEx", "DHL", "USPS"), "sent by {v}",
          "It was sent by {v}.", "The carrier is {v}.", enum=True))),
    Template("book_appointment", "Book an appointment with a doctor.", "book a doctor's appointment", (
        P("doctor", "string", "The doctor's name.", DOCTORS, "with {v}",
          "I want to see {v}.", "It's with {v}."),
        P("date", "string", "The appointment date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's on {v}.", "The date is {v}."),
        P("time", "string", "The appointment time, as HH:MM.", TIMES, "at {v}",
          "Make it at {v}.", "The time is {v}."),
        P("reason", "string", "The reason for the visit.", ("annual checkup", "sore throat", "back pain",
                                                           "vaccination", "skin rash"),
          "for a {v}", "It's for a {v}.", "The reason is a {v}.", required=False))),
    Template("create_event", "Create a calendar event.", "create a calendar event", (
        P("title", "string", "The event title.", ("book club", "garage sale", "pottery class", "game night",
                                                   "charity run", "wine tasting"),
          "called \"{v}\"", "Call it \"{v}\".", "The title is \"{v}\"."),
        P("date", "string", "The event date, as YYYY-MM-DD.", DATES, "on {v}",
          "It's on {v}.", "The date is {v}."),
        P("location", "string", "The event location.", CITIES, "in {v}",
          "It's in {v}.", "The location is {v}."),
        P("attendees", "integer", "The number of attendees.", tuple(range(12, 60, 7)), "for {v} attendees",
          "Expect {v} attendees.", "There will be {v} attendees.", required=False))),
    Template("pay_bill", "Pay a utility bill.", "pay a bill", (
        P("biller", "string", "The bill type.", ("electricity", "water", "internet", "phone", "gas"),
          "for {v}", "It's the {v} bill.", "I mean the {v} bill.", enum=True),
        P("amount", "float", "The amount.", AMOUNTS, "of {v}",
          "The amount is {v}.", "It comes to {v}."),
        P("due_date", "string", "The due date, as YYYY-MM-DD.", DATES, "due {v}",
          "It's due {v}.", "The due date is {v}.", required=False))),
    Template("search_recipes", "Search for recipes.", "find a recipe", (
        P("ingredient", "string", "The main ingredient.", ("chickpeas", "salmon", "mushrooms", "tofu", "lentils",
                                                            "spinach", "eggplant", "shrimp"),
          "with {v}", "It should use {v}.", "The main ingredient is {v}."),
        P("max_minutes", "integer", "The longest cooking time in minutes.", (15, 20, 25, 35, 40, 45, 50, 55),
          "in under {v} minutes", "It must take under {v} minutes.", "I have {v} minutes."),
        P("diet", "string", "The diet to follow.", ("vegan", "vegetarian", "keto", "paleo"), "that is {v}",
          "Make it {v}.", "It has to be {v}.", required=False, enum=True))),
    Template("log_workout", "Log a workout in the fitness app.", "log a workout", (
        P("activity", "string", "The workout type.", ("running", "cycling", "swimming", "rowing", "hiking"),
          "of {v}", "It was {v}.", "I went {v}.", enum=True),
        P("minutes", "integer", "The workout length in minutes.", (15, 20, 25, 35, 40, 45, 50, 55, 65, 70),
          "for {v} minutes", "It lasted {v} minutes.", "I did {v} minutes."),
        P("calories", "integer", "The calories burned.", tuple(range(120, 900, 45)), "burning {v} calories",
          "I burned {v} calories.", "It was {v} calories.", required=False))),
)

UNSEEN = (
    Template("book_train", "Book a train ticket.", "book a train ticket", (
        P("origin", "string", "The departure station's city.", CITIES, "from {v}",
          "I'm leaving from {v}.", "The train departs from {v}."),
        P("destination", "string", "The arrival city.", CITIES, "to {v}",
          "I'm going to {v}.", "The destination is {v}."),
        P("date", "string", "The travel date, as YYYY-MM-DD.", DATES, "on {v}",
          "I travel on {v}.", "The date is {v}."),
        P("seat_class", "string", "The seat class.", ("standard", "comfort", "first"), "in {v} class",
          "Put me in {v} class.", "I'd like {v} class.", required=False, enum=True))),
    Template("set_timer", "Start a countdown timer.", "set a timer", (
        P("minutes", "integer", "The timer length in minutes.", tuple(range(3, 60, 4)), "for {v} minutes",
          "Make it {v} minutes.", "It should run {v} minutes."),
        P("label", "string", "The timer's label.", ("pasta", "tea", "bread", "laundry", "eggs", "nap"),
          "labelled \"{v}\"", "Label it \"{v}\".", "Call it \"{v}\"."))),
    Template("convert_temperature", "Convert a temperature between scales.", "convert a temperature", (
        P("value", "float", "The temperature value.", tuple(t / 2 for t in range(-20, 200, 3)), "of {v}",
          "The temperature is {v}.", "It's {v} degrees."),
        P("from_scale", "string", "The scale to convert from.", ("celsius", "fahrenheit", "kelvin"), "from {v}",
          "It's in {v}.", "Convert from {v}.", enum=True),
        P("to_scale", "string", "The scale to convert to.", ("celsius", "fahrenheit", "kelvin"), "to {v}",
          "I want it in {v}.", "Convert it to {v}.", enum=True))),
    Template("send_email", "Send an email.", "send an email", (
        P("to", "string", "The recipient's address.", tuple(f"{p.lower()}@example.com" for p in PEOPLE), "to {v}",
          "Send it to {v}.", "The address is {v}."),
        P("subject", "string", "The subject line.", ("invoice", "weekend plans", "project update", "lunch",
                                                      "travel details", "welcome"),
          "with subject \"{v}\"", "The subject is \"{v}\".", "Use \"{v}\" as the subject."),
        P("priority", "string", "The priority.", ("low", "normal", "high"), "with {v} priority",
          "Mark it {v} priority.", "The priority is {v}.", required=False, enum=True))),
    Template("order_taxi", "Order a taxi ride.", "order a taxi", (
        P("pickup", "string", "The pick-up place.", ("Central Station", "City Airport", "Grand Hotel",
                                                         "Union Square", "Harbor Pier", "Museum Gate"),
          "from {v}", "Pick me up at {v}.", "I'm at {v}."),
        P("dropoff", "string", "The drop-off place.", ("Old Town", "Tech Park", "Riverside Mall", "North Campus",
                                               "Lakeside Arena", "West End"),
          "to {v}", "I'm going to {v}.", "Take me to {v}."),
        P("time", "string", "The pick-up time, as HH:MM.", TIMES, "at {v}",
          "Make it at {v}.", "The pick-up time is {v}."),
        P("passengers", "integer", "The number of passengers.", SMALL, "for {v} passengers",
          "We are {v} passengers.", "There will be {v} of us.", required=False),
        P("vehicle", "string", "The vehicle type.", ("sedan", "minivan", "estate"), "in a {v}",
          "Send a {v}.", "I need a {v}.", required=False, enum=True))),
    Template("rent_bike", "Rent a bike from a station.", "rent a bike", (
        P("station", "string", "The rental station.", ("Park Avenue", "Canal Street", "Market Hall",
                                                        "Library Square", "Bridge Road"),
          "at {v}", "The station is {v}.", "I'll take it from {v}."),
        P("hours", "integer", "The number of hours.", SMALL, "for {v} hours",
          "I need it {v} hours.", "It's for {v} hours."),
        P("bike_type", "string", "The bike type.", ("city", "electric", "mountain"), "of type {v}",
          "I want a {v} bike.", "The bike type is {v}.", required=False, enum=True))),
    Template("request_refund", "Ask for a refund on an order.", "request a refund", (
        P("order_id", "string", "The order number.", _codes("OR"), "for order {v}",
          "The order number is {v}.", "It's order {v}."),
        P("amount", "float", "The refund amount.", AMOUNTS, "of {v}",
          "Refund {v}.", "The amount is {v}."),
        P("reason", "string", "The reason for the refund.", ("damaged item", "wrong size", "late delivery",
                                                            "missing parts"),
          "because of a {v}", "It's a {v}.", "The reason is a {v}.", required=False))),
    Template("water_garden", "Water a garden zone.", "water the garden", (
        P("zone", "string", "The garden zone.", ("front lawn", "back lawn", "vegetable bed", "flower bed",
                                                 "greenhouse"),
          "in the {v}", "It's the {v}.", "I mean the {v}."),
        P("minutes", "integer", "The watering time in minutes.", tuple(range(5, 60, 5)), "for {v} minutes",
          "Water it for {v} minutes.", "Run it {v} minutes."),
        P("start_time", "string", "The start time, as HH:MM.", TIMES, "at {v}",
          "Start at {v}.", "The start time is {v}."))),
)
